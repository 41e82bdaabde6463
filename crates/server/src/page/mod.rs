//! The chat page served at `GET /`: one self-contained HTML file (inline CSS and JS, no external
//! assets, no network but the same-origin API) that streams replies from
//! `/v1/chat/completions`, renders Markdown safely and keeps the conversation in localStorage.
//! Its real-browser test is `scripts/test-chat-page` (tests/chat_page/).

/// The page, embedded at build time.
pub const INDEX_HTML: &str = include_str!("index.html");

/// Handler for `GET /`.
pub async fn index() -> axum::response::Html<&'static str> {
    axum::response::Html(INDEX_HTML)
}

#[cfg(test)]
mod tests {
    use super::INDEX_HTML;

    #[test]
    fn has_the_ids_the_browser_test_uses() {
        for id in [
            "system",
            "input",
            "send",
            "stop",
            "messages",
            "new-chat",
            "temperature",
            "max-tokens",
            "error",
        ] {
            assert!(
                INDEX_HTML.contains(&format!("id=\"{id}\"")),
                "the page lost #{id}"
            );
        }
    }

    #[test]
    fn is_self_contained() {
        let lower = INDEX_HTML.to_ascii_lowercase();
        for banned in [
            "<script src",
            "<link",
            "@import",
            "url(",
            "src=\"http",
            "href=\"http",
            "src=\"//",
            "href=\"//",
        ] {
            assert!(
                !lower.contains(banned),
                "the page loads something: {banned}"
            );
        }
        // The only HTML assignment is the escaped Markdown render.
        assert_eq!(lower.matches("innerhtml").count(), 1);
        assert!(INDEX_HTML.contains("innerHTML = renderMarkdown("));
        assert!(INDEX_HTML.contains("fetch(\"/v1/chat/completions\""));
    }
}
