//! A multi-turn chat over one engine: the conversation lives in the KV and each turn
//! prefills only what it adds.
//!
//! - A turn renders the conversation plus the new user message with the chat template and
//!   prefills the text past what the KV already holds ([`sync`]); the reply is generated at
//!   the next position. After the reply the template's closing text (Qwen's `<|im_end|>\n`,
//!   which generation stops at or short of) is appended, so the KV again holds the
//!   rendering of the whole history. A template that rewrites history (not append-only) is
//!   handled the same way: the KV is cut at the first token that differs and the rest is
//!   prefilled again.
//! - When the prompt plus the reply reserve does not fit, the oldest non-system turns are
//!   dropped: their tokens are removed from the KV and the rest shifted back (K re-RoPEd,
//!   [`Engine::kv_remove`]), so the next turn still prefills only its own tokens. A KV type
//!   that cannot shift (q8_0) falls back to re-rendering, with a notice. A message that
//!   cannot fit even alone is refused and the chat is left as it was.
//! - [`Chat::save`] / [`Chat::load`] keep the messages in a session file's application blob
//!   and the KV in its cells, so a resumed chat prefills nothing and continues
//!   bit-identically. A session whose KV does not fit this engine (another n_ctx, KV type,
//!   model or backend) still gives back its messages: the next turn renders and prefills
//!   them ([`Resumed::Messages`]), as the original engine did.
//! - [`render_prompt`] renders a whole conversation to ids with the message contents kept
//!   plain text (the server's path; see [`prompt`]).

pub mod interruptible;
pub mod prompt;
pub mod sync;

pub use interruptible::{
    generate_interruptible, generate_interruptible_with_progress, resume_interruptible,
    Interruptible,
};
pub use prompt::{render_prompt, PromptError};

use crate::sampler::SamplerConfig;
use crate::{FinishReason, GenerateRequest, Timings, TokenBytes};
use minfer_engine::kv::kv_can_shift;
use minfer_engine::session::SessionError;
use minfer_engine::{Engine, Error as EngineError};
use minfer_tokenizer::template::{self, ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::{TokenType, Tokenizer};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use sync::TokenText;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Template(#[from] template::Error),
    #[error(transparent)]
    Tokenizer(#[from] minfer_tokenizer::Error),
    #[error("generation failed: {0}")]
    Generate(String),
    #[error("the message needs {tokens} tokens with the template (plus one for the reply), more than the context of {n_ctx}; nothing was changed")]
    MessageTooLong { tokens: usize, n_ctx: usize },
    #[error("the reply filled the context of {n_ctx} and no older turn is left to drop; the turn was discarded")]
    ReplyFilledContext { n_ctx: usize },
    #[error("nothing to regenerate: the last message is not a reply")]
    NothingToRegenerate,
    #[error("session application data: {0}")]
    SessionData(String),
}

pub type Result<T> = std::result::Result<T, ChatError>;

/// Token bytes as llama.cpp prints them by default: control tokens print nothing.
pub struct Pieces<'a>(pub &'a Tokenizer);

impl TokenBytes for Pieces<'_> {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        match self.0.token_type(id) {
            Ok(TokenType::Control) | Err(_) => Vec::new(),
            Ok(_) => self.0.piece(id).map(<[u8]>::to_vec).unwrap_or_default(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ChatConfig {
    pub sampler: SamplerConfig,
    /// Reply tokens at most.
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Context kept free for the reply when old turns are dropped (at most a quarter of
    /// the context).
    pub reply_reserve: usize,
    /// Every reply follows this grammar (a fresh state each turn).
    pub constraint: Option<crate::constrain::Grammar>,
    /// Prompt lookup decoding for the replies (greedy or sampled; not with mirostat).
    pub lookup: Option<crate::lookup::LookupConfig>,
    /// A draft model (or self-drafting) for the replies ([`crate::draft`]; not with `lookup`).
    pub draft: Option<crate::draft::DraftHandle>,
}

impl Default for ChatConfig {
    fn default() -> Self {
        ChatConfig {
            sampler: SamplerConfig::default(),
            max_tokens: 512,
            stop: Vec::new(),
            reply_reserve: 512,
            constraint: None,
            lookup: None,
            draft: None,
        }
    }
}

/// How a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnEnd {
    Finished(FinishReason),
    /// Stopped by the user (Ctrl-C); the partial reply is kept.
    Interrupted,
}

/// What one turn did.
#[derive(Clone, Debug)]
pub struct TurnReport {
    /// Tokens decoded in batches this turn: the new prompt and the reply's closing text.
    pub prefilled: usize,
    pub prompt_tokens: usize,
    pub closing_tokens: usize,
    /// Tokens sampled (an end-of-generation token included).
    pub generated: usize,
    pub end: TurnEnd,
    pub dropped_turns: usize,
    /// Things the user should know (dropped turns, a re-render).
    pub notices: Vec<String>,
    pub timings: Timings,
    pub reply: String,
    /// What prompt lookup did this turn, when the chat speculates.
    pub speculative: Option<crate::lookup::SpecStats>,
}

pub struct Chat {
    engine: Engine,
    tok: Tokenizer,
    template: ChatTemplate,
    template_notice: Option<String>,
    cfg: ChatConfig,
    messages: Vec<Message>,
    /// The ids in the KV, one per position.
    kv: Vec<u32>,
    /// Replies generated so far (varies the seed per reply).
    generation: u64,
}

/// The rendering of a conversation; no messages render as nothing (templates index
/// `messages[0]`, and an empty conversation is an empty KV).
fn rendered(template: &ChatTemplate, messages: &[Message], gen: bool) -> Result<String> {
    if messages.is_empty() {
        return Ok(String::new());
    }
    Ok(template.render(
        messages,
        &RenderOptions {
            add_generation_prompt: gen,
            ..RenderOptions::default()
        },
    )?)
}

impl Chat {
    pub fn new(engine: Engine, cfg: ChatConfig) -> Result<Chat> {
        let md = engine.model().metadata();
        let tok = Tokenizer::from_metadata(md)?;
        let loaded = ChatTemplate::from_metadata(md)?;
        Ok(Chat {
            engine,
            tok,
            template: loaded.template,
            template_notice: loaded.notice,
            cfg,
            messages: Vec::new(),
            kv: Vec::new(),
            generation: 0,
        })
    }

    /// Set when the model has no template and ChatML is used.
    pub fn template_notice(&self) -> Option<&str> {
        self.template_notice.as_deref()
    }
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }
    /// The ids the KV holds.
    pub fn kv_tokens(&self) -> &[u32] {
        &self.kv
    }
    pub fn config_mut(&mut self) -> &mut ChatConfig {
        &mut self.cfg
    }

    /// Sets (or with None removes) the system message; the KV follows at the next turn.
    pub fn set_system(&mut self, text: Option<&str>) {
        let has = self.messages.first().is_some_and(|m| m.role == "system");
        match (text, has) {
            (Some(t), true) => self.messages[0] = Message::system(t),
            (Some(t), false) => self.messages.insert(0, Message::system(t)),
            (None, true) => {
                self.messages.remove(0);
            }
            (None, false) => {}
        }
    }

    /// Forgets every turn (the system message stays) and clears the KV.
    pub fn clear(&mut self) {
        self.messages.retain(|m| m.role == "system");
        self.engine.kv_clear();
        self.kv.clear();
    }

    fn first_turn(&self) -> usize {
        usize::from(self.messages.first().is_some_and(|m| m.role == "system"))
    }

    fn token_text(&self) -> TokenText {
        TokenText::from_pieces(self.kv.iter().map(|&id| self.tok.piece(id).unwrap_or(&[])))
    }

    /// The tokens to keep and the tokens to append so the KV holds `target`.
    fn plan(&self, target: &str) -> (usize, Vec<u32>) {
        let t = self.token_text();
        let keep = sync::keep_prefix(&t, target);
        let append = self.tok.encode(&target[t.start(keep)..], true);
        (keep, append)
    }

    fn truncate(&mut self, n: usize) {
        self.engine.kv_truncate(n);
        self.kv.truncate(n);
    }

    /// Drops the oldest non-system turn (a user message and what follows up to the next
    /// user message). Returns false when there is none.
    fn drop_oldest_turn(&mut self, notices: &mut Vec<String>) -> Result<bool> {
        let first = self.first_turn();
        if first >= self.messages.len() {
            return Ok(false);
        }
        let end = (first + 1..self.messages.len())
            .find(|&i| self.messages[i].role == "user")
            .unwrap_or(self.messages.len());
        let mut kept = self.messages.clone();
        kept.drain(first..end);
        let full = rendered(&self.template, &self.messages, false)?;
        let target = rendered(&self.template, &kept, false)?;
        let ty = self.engine.cache_type();
        let d = full.len().saturating_sub(target.len());
        let window = sync::removal_window(&self.token_text(), target.as_bytes(), d);
        match window {
            Some((i, j)) if kv_can_shift(ty) => {
                self.engine.kv_remove(i, j)?;
                self.kv.drain(i..j);
                notices.push(format!(
                    "context full: dropped the oldest turn ({} tokens); the rest shifted back {} positions",
                    j - i,
                    j - i
                ));
            }
            Some(_) => notices.push(format!(
                "context full: dropped the oldest turn; a {ty} KV cannot shift, so the history is re-rendered and prefilled again"
            )),
            None => notices.push(
                "context full: dropped the oldest turn; the template renders the rest differently, so it is re-rendered and prefilled again".into(),
            ),
        }
        self.messages = kept;
        Ok(true)
    }

    fn sampler_for_this_reply(&self) -> SamplerConfig {
        let mut s = self.cfg.sampler.clone();
        s.seed = s
            .seed
            .wrapping_add(self.generation.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        s
    }

    /// One turn: `user` is added, a reply is generated and streamed to `on_text`. Setting
    /// `cancel` stops the reply between tokens (the partial reply is kept).
    pub fn send(
        &mut self,
        user: &str,
        cancel: &AtomicBool,
        mut on_text: impl FnMut(&[u8]),
    ) -> Result<TurnReport> {
        let n_ctx = self.engine.n_ctx();
        let user_msg = Message::user(user);
        // A message that cannot fit even alone is refused before anything changes.
        let mut alone: Vec<Message> = self.messages[..self.first_turn()].to_vec();
        alone.push(user_msg.clone());
        let alone_tokens = self
            .tok
            .encode(&rendered(&self.template, &alone, true)?, true)
            .len();
        if alone_tokens + 1 > n_ctx {
            return Err(ChatError::MessageTooLong {
                tokens: alone_tokens,
                n_ctx,
            });
        }
        let reserve = self.cfg.reply_reserve.min(n_ctx / 4).max(1);
        let mut notices = Vec::new();
        let mut dropped = 0;
        let with_user = |messages: &[Message]| {
            let mut all = messages.to_vec();
            all.push(user_msg.clone());
            all
        };
        let (keep, mut prompt) = loop {
            let target = rendered(&self.template, &with_user(&self.messages), true)?;
            let (keep, append) = self.plan(&target);
            if keep + append.len() + reserve <= n_ctx || !self.drop_oldest_turn(&mut notices)? {
                break (keep, append);
            }
            dropped += 1;
        };
        if keep + prompt.len() + 1 > n_ctx {
            return Err(ChatError::MessageTooLong {
                tokens: prompt.len(),
                n_ctx: n_ctx - keep,
            });
        }
        self.truncate(keep);
        if prompt.is_empty() {
            // Generation needs logits: decode the last held token again.
            let last = self.kv.pop().ok_or(ChatError::NothingToRegenerate)?;
            self.engine.kv_truncate(self.kv.len());
            prompt.push(last);
        }
        let base = self.kv.len();
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: self.cfg.max_tokens,
            sampler: self.sampler_for_this_reply(),
            stop_strings: self.cfg.stop.clone(),
            eog: self.tok.eog_ids().to_vec(),
            logprobs: None,
            // One fresh grammar state per turn.
            constraint: self.cfg.constraint.clone(),
            lookup: self.cfg.lookup,
            draft: self.cfg.draft.clone(),
        };
        let mut text = Vec::new();
        let seq = self.engine.default_seq();
        let res = resume_interruptible(
            &mut self.engine,
            &Pieces(&self.tok),
            seq,
            base,
            &req,
            cancel,
            |b| {
                text.extend_from_slice(b);
                on_text(b)
            },
            |_, _| {},
        );
        let (end, generated, timings, fed, speculative) = match res {
            Ok(r) => {
                let end = match r.interrupted {
                    true => TurnEnd::Interrupted,
                    false => TurnEnd::Finished(r.out.finish),
                };
                let spec = r.out.speculative;
                (end, r.out.tokens.len(), r.out.timings, r.kv_tokens, spec)
            }
            Err(e) => {
                // The messages are unchanged; the KV keeps what it held before the turn.
                self.engine.kv_truncate(base);
                return Err(ChatError::Generate(e.to_string()));
            }
        };
        self.kv.extend_from_slice(&fed);
        let reply = String::from_utf8_lossy(&text).into_owned();
        self.messages.push(user_msg);
        self.messages.push(Message::assistant(reply.as_str()));
        self.generation += 1;
        // Close the reply: the KV must hold the rendering of the history.
        let closing = loop {
            let target = rendered(&self.template, &self.messages, false)?;
            let (keep, append) = self.plan(&target);
            if keep + append.len() <= n_ctx {
                break Some((keep, append));
            }
            // Cut back to what matches the rendering (the reply's raw tail may not), then
            // only turns before this one may go.
            self.truncate(keep);
            if !self.drop_oldest_turn_before_last(&mut notices)? {
                break None;
            }
            dropped += 1;
        };
        let Some((keep, append)) = closing else {
            let n = self.messages.len();
            self.messages.truncate(n - 2);
            let target = rendered(&self.template, &self.messages, false)?;
            let (keep, _) = self.plan(&target);
            self.truncate(keep);
            return Err(ChatError::ReplyFilledContext { n_ctx });
        };
        self.truncate(keep);
        if !append.is_empty() {
            self.engine.decode(&append, keep, 1)?;
            self.kv.extend_from_slice(&append);
        }
        Ok(TurnReport {
            prefilled: prompt.len() + append.len(),
            prompt_tokens: prompt.len(),
            closing_tokens: append.len(),
            generated,
            end,
            dropped_turns: dropped,
            notices,
            timings,
            reply,
            speculative,
        })
    }

    /// Drops the oldest turn unless it is the last one (the reply being closed).
    fn drop_oldest_turn_before_last(&mut self, notices: &mut Vec<String>) -> Result<bool> {
        let first = self.first_turn();
        let users = self.messages[first..]
            .iter()
            .filter(|m| m.role == "user")
            .count();
        if users < 2 {
            return Ok(false);
        }
        self.drop_oldest_turn(notices)
    }

    /// Generates the last reply again.
    pub fn regen(&mut self, cancel: &AtomicBool, on_text: impl FnMut(&[u8])) -> Result<TurnReport> {
        let n = self.messages.len();
        if n < 2 || self.messages[n - 1].role != "assistant" || self.messages[n - 2].role != "user"
        {
            return Err(ChatError::NothingToRegenerate);
        }
        let saved = self.messages.clone();
        let user = self.messages[n - 2].content.clone().unwrap_or_default();
        self.messages.truncate(n - 2);
        let r = self.send(&user, cancel, on_text);
        if r.is_err() && self.messages.len() == n - 2 {
            self.messages = saved;
        }
        r
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct AppData {
    format: String,
    messages: Vec<Message>,
    generation: u64,
}

const APP_FORMAT: &str = "minfer-chat/1";

impl Chat {
    /// Saves the conversation and its KV.
    pub fn save(&mut self, path: &Path) -> Result<()> {
        let app = AppData {
            format: APP_FORMAT.into(),
            messages: self.messages.clone(),
            generation: self.generation,
        };
        let blob = serde_json::to_vec(&app).map_err(|e| ChatError::SessionData(e.to_string()))?;
        self.engine.save_session(path, &self.kv, &blob)?;
        Ok(())
    }

    /// Restores a conversation and, when it fits this engine, its KV. The file is verified
    /// whole first (checksum, format, application data), so on any error the chat and the
    /// engine are unchanged. A session whose KV does not fit (another n_ctx, KV type, model
    /// or backend: [`kv_mismatch`]) restores the messages alone and empties the KV; the
    /// next turn renders and prefills them.
    pub fn load(&mut self, path: &Path) -> Result<Resumed> {
        let bytes = std::fs::read(path).map_err(|source| {
            EngineError::from(SessionError::Io {
                path: path.to_path_buf(),
                source,
            })
        })?;
        let (app, session) = match self.engine.read_session(&bytes) {
            Ok(s) => (s.app.clone(), Ok(s)),
            Err(EngineError::Session(why)) if kv_mismatch(&why) => (
                minfer_engine::session::app_blob(&bytes)
                    .map_err(EngineError::from)?
                    .to_vec(),
                Err(why),
            ),
            Err(e) => return Err(e.into()),
        };
        let app: AppData =
            serde_json::from_slice(&app).map_err(|e| ChatError::SessionData(e.to_string()))?;
        if app.format != APP_FORMAT {
            return Err(ChatError::SessionData(format!(
                "format {:?}, expected {APP_FORMAT:?}",
                app.format
            )));
        }
        let resumed = match session {
            Ok(s) => {
                self.engine.apply_session(&s)?;
                self.kv = s.tokens().to_vec();
                Resumed::Kv {
                    tokens: self.kv.len(),
                }
            }
            Err(why) => {
                self.engine.kv_clear();
                self.kv.clear();
                Resumed::Messages { why }
            }
        };
        self.messages = app.messages;
        self.generation = app.generation;
        Ok(resumed)
    }
}

/// What [`Chat::load`] restored.
#[derive(Debug)]
pub enum Resumed {
    /// The messages and the KV of this many tokens: nothing to prefill.
    Kv { tokens: usize },
    /// The messages only: the saved KV does not fit this engine, for the reason given; the
    /// next turn prefills the conversation's rendering.
    Messages { why: SessionError },
}

/// Whether a session error says the saved KV does not fit this engine (a setting or the
/// model differs), as opposed to a file that cannot be read (corrupt, truncated, another
/// format), whose messages cannot be trusted either.
pub fn kv_mismatch(e: &SessionError) -> bool {
    use SessionError as S;
    match e {
        S::OtherModel { .. }
        | S::NCtx { .. }
        | S::KvType { .. }
        | S::Backend { .. }
        | S::TooManyTokens { .. }
        | S::TokenOutOfRange { .. }
        | S::NoRoom { .. } => true,
        S::Field { field, .. } => *field != "reserved" && *field != "layer reserved",
        S::Io { .. }
        | S::Magic { .. }
        | S::Version { .. }
        | S::Truncated { .. }
        | S::Trailing { .. }
        | S::Checksum { .. }
        | S::DuplicateSeq { .. }
        | S::NoSuchSeq { .. }
        | S::Save(_) => false,
    }
}
