//! Prompts from requests: chat messages through the model's template (with tools), raw
//! text, token ids; and the context-length check.

use crate::error::ApiError;
use crate::request::chat::{ChatRequest, ToolChoice};
use crate::request::completion::Prompt;
use crate::AppState;
use minfer_generate::chat::{render_prompt, PromptError};
use minfer_tokenizer::template::RenderOptions;

/// A chat prompt and the text the reply is forced to start with (`tool_choice` required
/// or named: the opening of a tool call is written for the model).
pub struct ChatPrompt {
    pub tokens: Vec<u32>,
    pub forced: String,
}

/// What marks a tool call in the output of the templates minfer parses (Qwen's).
pub const TOOL_CALL_OPEN: &str = "<tool_call>";

pub fn chat_prompt(state: &AppState, req: &ChatRequest) -> Result<ChatPrompt, ApiError> {
    let template = state.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(format!(
            "the model's chat template cannot be used: {}",
            state.template_error.as_deref().unwrap_or("none")
        ))
    })?;
    let tools = match req.tool_choice {
        ToolChoice::None => None,
        _ => req.tools.clone(),
    };
    if tools.is_some() && !template.source().contains("tools") {
        return Err(ApiError::bad_field(
            "tools",
            "the model's chat template does not render tools",
        ));
    }
    let forced = match &req.tool_choice {
        ToolChoice::Required | ToolChoice::Named(_)
            if !template.source().contains(TOOL_CALL_OPEN) =>
        {
            return Err(ApiError::bad_field(
                "tool_choice",
                "the model's chat template has no <tool_call> syntax to force a call with",
            ))
        }
        // Up to the name: after a bare opening small models often end the reply at once.
        ToolChoice::Required => format!("{TOOL_CALL_OPEN}\n{{\"name\": \""),
        ToolChoice::Named(name) => {
            let name = serde_json::to_string(name).unwrap_or_default();
            format!("{TOOL_CALL_OPEN}\n{{\"name\": {name}, \"arguments\": ")
        }
        _ => String::new(),
    };
    let opts = RenderOptions {
        add_generation_prompt: true,
        tools,
        ..RenderOptions::default()
    };
    // Message content is tokenized as plain text: a user's `<|im_start|>` is not a
    // control token (the template's own are).
    let (_, mut tokens) =
        render_prompt(template, &state.tok, &req.messages, &opts).map_err(|e| match e {
            PromptError::Template(e) => {
                ApiError::bad_request(format!("the chat template refused the messages: {e}"))
            }
            other => ApiError::bad_field("messages", other.to_string()),
        })?;
    // The forced opening starts with a special token, so tokenizing it apart from the
    // rendered prompt gives the ids of the whole text.
    tokens.extend(state.tok.encode(&forced, true));
    check_len(state, &tokens)?;
    Ok(ChatPrompt { tokens, forced })
}

/// A raw completion prompt's tokens (special-token text parsed unless turned off).
pub fn text_prompt(
    state: &AppState,
    p: &Prompt,
    parse_special: bool,
) -> Result<Vec<u32>, ApiError> {
    let mut tokens = match p {
        Prompt::Text(s) => state.tok.encode_prompt(s, true, parse_special),
        Prompt::Tokens(t) => t.clone(),
    };
    // `prompt: ""` (OpenAI's default prompt is `<|endoftext|>`): the model's BOS token,
    // when the tokenizer did not add it already.
    if tokens.is_empty() {
        match state.tok.special_ids().bos {
            Some(bos) => tokens.push(bos),
            None => {
                return Err(ApiError::bad_field(
                    "prompt",
                    "the prompt is empty and this model has no BOS token to start from",
                ))
            }
        }
    }
    check_len(state, &tokens)?;
    Ok(tokens)
}

/// A prompt must leave room for at least one generated token.
pub fn check_len(state: &AppState, tokens: &[u32]) -> Result<(), ApiError> {
    let n_ctx = state.limits.n_ctx;
    if tokens.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if tokens.len() >= n_ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {} tokens, but the context holds {n_ctx} (it must leave room for a reply)",
            tokens.len()
        ))
        .with_code("context_length_exceeded"));
    }
    let max = state.limits.max_prompt_tokens;
    if tokens.len() > max {
        return Err(ApiError::bad_request(format!(
            "the prompt has {} tokens; this server takes at most {max} (--max-prompt-tokens)",
            tokens.len()
        ))
        .with_code("prompt_too_long"));
    }
    Ok(())
}

/// A prompt of `prompt` tokens and an explicit `max_tokens` must fit one sequence's context
/// together (OpenAI's and vLLM's 400): a request that could never finish as asked is refused
/// up front, naming the sizes, instead of being cut short with `length` by the full context.
/// Without `max_tokens` the reply runs until the context is full.
pub fn check_fit(
    state: &AppState,
    prompt: usize,
    max_tokens: Option<usize>,
) -> Result<(), ApiError> {
    let n_ctx = state.limits.n_ctx;
    match max_tokens {
        Some(m) if prompt.saturating_add(m) > n_ctx => Err(ApiError::bad_field(
            "max_tokens",
            format!(
                "the prompt has {prompt} tokens and `max_tokens` asks for {m} more, {} in all, \
                 but a sequence holds at most {n_ctx} tokens (the context); ask for at most {} \
                 tokens or shorten the prompt",
                prompt.saturating_add(m),
                n_ctx.saturating_sub(prompt)
            ),
        )
        .with_code("context_length_exceeded")),
        _ => Ok(()),
    }
}
