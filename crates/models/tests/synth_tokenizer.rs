//! The built-in synthesized tokenizer loads in minfer's tokenizer and chat template, and
//! encodes as its merge table says (ids worked out by hand from the table's ranks).

use minfer_models::synth::{self, SynthSpec};
use minfer_models::Arch;
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::Tokenizer;

fn metadata(arch: Arch) -> minfer_gguf::Metadata {
    let mut spec = SynthSpec::new(arch, 1, 64, 4, 2, 64);
    spec.vocab_size = Some(320);
    synth::synthesize(&spec).unwrap().metadata
}

#[test]
fn builtin_tokenizer_encodes_by_its_merge_ranks() {
    for arch in [Arch::Qwen2, Arch::Llama] {
        let tok = Tokenizer::from_metadata(&metadata(arch)).unwrap();
        assert_eq!(tok.n_vocab(), 320);
        // Byte tokens are ids 0..256 in byte order; merge k makes token 256 + k.
        // "Hello" → H + ello (merges e·l 31, el·l 32, ell·o 35); " world" → Ġw (25) or (11)
        // l d; " Hello" → ĠHello (Ġ·H 33, ĠH·ell 34, ĠHell·o 36). Control: with ell·o ranked
        // before ĠH·ell (this table's first draft) " Hello" ends as ĠH + ello and this fails.
        let ids = tok.encode("Hello world Hello", false);
        assert_eq!(
            ids,
            vec![72, 256 + 35, 256 + 25, 256 + 11, 108, 100, 256 + 36],
            "{arch:?}"
        );
        assert_eq!(tok.decode(&ids).unwrap(), b"Hello world Hello");
        // Control tokens follow the 37 merges: <|endoftext|> 293, <|im_start|> 294, <|im_end|> 295.
        assert_eq!(
            tok.encode("<|im_start|>x<|im_end|>", true),
            vec![294, 120, 295]
        );
        // Text of every byte class (ASCII controls, Latin-1, CJK, emoji) falls back to byte
        // tokens and round-trips.
        let text = "naïve\t\u{0}\r\n日本 🦀 ÿ";
        let ids = tok.encode(text, false);
        assert_eq!(tok.decode(&ids).unwrap(), text.as_bytes(), "{arch:?}");
    }
}

#[test]
fn builtin_chat_template_renders_chatml() {
    let md = metadata(Arch::Qwen2);
    let t = ChatTemplate::from_metadata(&md).unwrap();
    assert!(t.notice.is_none(), "the template is in the file");
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let text = t
        .template
        .render(&[Message::system("be brief"), Message::user("hi")], &opts)
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}
