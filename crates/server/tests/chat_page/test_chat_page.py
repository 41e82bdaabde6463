#!/usr/bin/env python3
"""Real-browser test of the chat page that `minfer serve` serves at `/`.

Drives headless Chromium (Debian's `chromium` + `chromium-driver`) through selenium against a
running server given by --url: sends a message and watches the reply stream in, stops a long
reply mid-way, sends another, reloads the page and checks the conversation came back from
localStorage, then starts a new chat. With --fake (the server is fake_server.py beside this
file) it also checks the Markdown rendering of its canned reply, HTML escaping, the API-key
header, that Stop dropped the connection, and how HTTP and in-stream errors are shown.

Usually run through scripts/test-chat-page, which installs what it needs and starts a server.
Prints one line per check and a closing `chat-page: N passed, N failed`; exits non-zero on the
first failure (later checks build on earlier ones).
"""

import argparse
import json
import os
import shutil
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys


class Failure(Exception):
    pass


class Test:
    def __init__(self, args):
        self.args = args
        self.url = args.url.rstrip("/")
        self.passed = 0
        self.driver = None

    # ------------------------------------------------------------ plumbing
    def ok(self, what):
        self.passed += 1
        print(f"ok {self.passed} - {what}", flush=True)

    def check(self, cond, what, detail=""):
        if not cond:
            raise Failure(what + (f": {detail}" if detail else ""))
        self.ok(what)

    def wait(self, cond, timeout, what, interval=0.05):
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                raise Failure(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(interval)

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def el(self, css):
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def start_browser(self):
        chromium = self.args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
        driver = self.args.chromedriver or shutil.which("chromedriver")
        if not chromium or not driver:
            raise Failure("chromium and chromedriver must be on PATH (apt-get install chromium chromium-driver)")
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                  "--window-size=1100,900", "--no-first-run", "--disable-extensions"):
            opts.add_argument(a)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # Explicit driver path: selenium then never tries to download one.
        self.driver = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
        self.driver.set_page_load_timeout(30)

    def open_settings(self):
        if not self.js("return document.getElementById('settings').open"):
            self.el("#settings-toggle").click()
            self.wait(lambda: self.el("#system").is_displayed(), 5, "the settings panel to open")

    def set_field(self, css, value):
        f = self.el(css)
        f.clear()
        if value != "":
            f.send_keys(value)

    def fake_stats(self):
        with urllib.request.urlopen(self.url + "/fake/stats", timeout=5) as r:
            return json.load(r)

    def assistants(self):
        return self.driver.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")

    def last_reply_state(self):
        """[class list, body text length, body text] of the last assistant message, or None."""
        return self.js("""
            const all = document.querySelectorAll('#messages .msg.assistant');
            const el = all[all.length - 1];
            if (!el) return null;
            const body = el.querySelector('.body');
            return [Array.from(el.classList), body.textContent.length, body.textContent];
        """)

    def send(self, text, use_enter=False):
        """Types text (\\n as Shift+Enter) and sends it; returns the new assistant element."""
        before = len(self.assistants())
        box = self.el("#input")
        box.click()
        lines = text.split("\n")
        for i, line in enumerate(lines):
            box.send_keys(line)
            if i + 1 < len(lines):
                box.send_keys(Keys.SHIFT, Keys.ENTER)
        self.check(box.get_attribute("value") == text, "the input box holds the typed text (Shift+Enter is a newline)",
                   repr(box.get_attribute("value")))
        if use_enter:
            box.send_keys(Keys.ENTER)
        else:
            self.el("#send").click()
        self.wait(lambda: len(self.assistants()) > before, 10, "a new assistant message")
        users = self.driver.find_elements(By.CSS_SELECTOR, "#messages .msg.user .body")
        self.check(users and users[-1].get_attribute("textContent") == text, "the user message is shown as typed",
                   repr(users[-1].get_attribute("textContent") if users else None))
        return self.assistants()[-1]

    def watch_reply(self, timeout):
        """Polls the last reply until it leaves `streaming`; returns (classes, text, lengths seen)."""
        lengths = []
        deadline = time.monotonic() + timeout
        while True:
            cls, n, text = self.last_reply_state()
            if "streaming" not in cls:
                return cls, text, lengths
            if n and (not lengths or lengths[-1] != n):
                lengths.append(n)
            if time.monotonic() > deadline:
                raise Failure(f"reply still streaming after {timeout}s ({n} chars so far)")
            time.sleep(0.01)

    # --------------------------------------------------------------- steps
    def run(self):
        a = self.args
        self.start_browser()
        self.driver.get(self.url + "/")
        self.js("localStorage.clear()")
        self.driver.refresh()
        self.wait(lambda: self.driver.find_elements(By.ID, "input"), 10, "the page to load")
        for id_ in ("system", "input", "send", "stop", "messages", "new-chat", "temperature", "max-tokens", "error"):
            if not self.driver.find_elements(By.ID, id_):
                raise Failure(f"the page has no #{id_}")
        self.ok("the page loads with all its controls")
        self.check(not self.driver.find_elements(By.CSS_SELECTOR, "#messages .msg"), "a fresh page has no messages")
        self.check(not self.el("#send").get_attribute("disabled") and self.el("#stop").get_attribute("disabled"),
                   "Send is enabled and Stop disabled when idle")

        self.open_settings()
        self.set_field("#system", "You are a helpful assistant. Keep answers short.")
        self.set_field("#temperature", "0")
        self.set_field("#max-tokens", str(a.short_tokens) if a.short_tokens else "")
        if a.api_key:
            self.set_field("#api-key", a.api_key)

        # 1. A reply streams in and finishes.
        prompt = "Write a tiny Python function that adds two numbers."
        if a.fake:
            prompt += ' Also echo this: <img src=x onerror="window.__xss=1"> & <b>bold?</b>'
        self.send(prompt)
        cls, text, lengths = self.watch_reply(a.reply_timeout)
        self.check("done" in cls, "the first reply finishes with class `done`",
                   f"classes {cls}; #error says {self.el('#error').text!r}")
        self.check(text.strip(), "the first reply has text")
        self.check(len(lengths) >= 2 and lengths[-1] > lengths[0], "the reply text grew while streaming",
                   f"lengths seen while streaming: {lengths}")
        print(f"#   reply grew in {len(lengths)} steps to {len(text)} chars", flush=True)
        self.check(self.js("return document.querySelectorAll('#messages img, #messages script').length") == 0
                   and not self.js("return window.__xss || null"), "no HTML from messages reaches the DOM")
        if self.driver.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant pre > code"):
            self.ok("a code block in the reply is rendered as <pre><code>")
        elif a.fake:
            raise Failure("the fake reply has a fenced code block but no <pre><code> was rendered")
        else:
            print("#   (the model's reply had no code block; not checked)", flush=True)
        if a.fake:
            self.check_fake_markdown()

        # 2. Stop a long reply mid-way.
        self.set_field("#max-tokens", str(a.long_tokens))
        stats0 = self.fake_stats() if a.fake else None
        self.send("Count from 1 to 1000, writing each number on its own line.", use_enter=True)
        self.wait(lambda: self.last_reply_state()[1] >= 20 or "streaming" not in self.last_reply_state()[0],
                  a.reply_timeout, "the long reply to start streaming")
        cls = self.last_reply_state()[0]
        if "streaming" not in cls:
            raise Failure(f"the long reply ended ({cls}) before Stop could be clicked; #error says {self.el('#error').text!r}")
        self.check(self.el("#stop").is_enabled() and not self.el("#send").is_enabled(),
                   "Stop is enabled and Send disabled while streaming")
        self.el("#stop").click()
        self.wait(lambda: "stopped" in self.last_reply_state()[0], 5, "the reply to get class `stopped`")
        cls, n, text = self.last_reply_state()
        self.check("streaming" not in cls and "done" not in cls and n > 0,
                   "Stop leaves the partial reply, marked `stopped`", f"classes {cls}, {n} chars")
        time.sleep(1.5)
        cls2, n2, _ = self.last_reply_state()
        self.check(n2 == n and "stopped" in cls2, "the stopped reply does not grow any more", f"{n} -> {n2} chars, {cls2}")
        self.check(not self.el("#stop").is_enabled() and self.el("#send").is_enabled(),
                   "after Stop, Send is enabled again and Stop disabled")
        if a.fake:
            self.wait(lambda: self.fake_stats()["disconnects"] > stats0["disconnects"], 5,
                      "the fake server to see the client disconnect")
            self.ok("Stop closed the connection (the server saw the disconnect)")

        # 3. A further message still works (sent with Enter, two lines via Shift+Enter).
        self.set_field("#max-tokens", str(a.short_tokens) if a.short_tokens else "")
        self.send("Thanks!\nNow say hello in one short sentence.", use_enter=True)
        cls, text, _ = self.watch_reply(a.reply_timeout)
        self.check("done" in cls and text.strip(), "a message after Stop gets a full reply",
                   f"classes {cls}; #error says {self.el('#error').text!r}")

        if a.fake:
            self.check_fake_errors()

        # 4. The conversation survives a reload.
        snapshot = "return Array.from(document.querySelectorAll('#messages .msg')).map(e => [e.className, e.querySelector('.body').textContent])"
        before = self.js(snapshot)
        self.driver.refresh()
        self.wait(lambda: self.driver.find_elements(By.CSS_SELECTOR, "#messages .msg"), 10, "messages after reload")
        after = self.js(snapshot)
        self.check(after == before, f"the conversation ({len(before)} messages) survives a reload",
                   f"before {before!r}\nafter  {after!r}")
        self.check(self.el("#system").get_attribute("value") == "You are a helpful assistant. Keep answers short.",
                   "the system prompt survives a reload")
        if a.api_key:
            self.check(self.el("#api-key").get_attribute("value") == a.api_key, "the API key survives a reload")

        # 5. New chat empties it, for good.
        self.el("#new-chat").click()
        self.wait(lambda: not self.driver.find_elements(By.CSS_SELECTOR, "#messages .msg"), 5, "New chat to clear")
        self.driver.refresh()
        self.wait(lambda: self.driver.find_elements(By.ID, "messages"), 10, "the page to reload")
        time.sleep(0.3)
        self.check(not self.driver.find_elements(By.CSS_SELECTOR, "#messages .msg"),
                   "New chat clears the conversation, also after a reload")
        self.check(not self.js("return window.__xss || null"), "no injected script ran during the whole test")

    def check_fake_markdown(self):
        body = self.assistants()[-1].find_element(By.CSS_SELECTOR, ".body")
        q = lambda css: body.find_elements(By.CSS_SELECTOR, css)  # noqa: E731
        code = q("pre > code.language-python")
        self.check(code and "def main():" in code[0].get_attribute("textContent"),
                   "the fenced block is <pre><code class=language-python> with the code")
        self.check("<b>not bold</b>" in code[0].get_attribute("textContent") and not q("pre b"),
                   "HTML inside the code block is shown as text")
        self.check([e.text for e in q(".codeblock .lang")] == ["python"], "the code block has a `python` label")
        self.check(q("h2") and q("h2")[0].text == "Steps", "`## Steps` is an <h2>")
        self.check(q("strong") and q("strong")[0].text == "short" and q("em") and q("em")[0].text == "emphasis",
                   "bold and italic render as <strong>/<em>")
        self.check(q("p > code") and q("p > code")[0].text == "inline code", "inline code renders as <code>")
        links = q("a")
        self.check(len(links) == 1 and links[0].get_attribute("href") == "https://example.com/docs?a=1&b=2"
                   and "noopener" in (links[0].get_attribute("rel") or ""), "the link is an <a> with rel=noopener",
                   repr([(x.get_attribute("href"), x.get_attribute("rel")) for x in links]))
        self.check(len(q("ol > li")) == 3 and len(q("ol > li ul > li")) == 2, "a numbered list with a nested list")
        quote = q("blockquote")
        self.check(quote and "<img src=x" in quote[0].text and "<b>bold?</b>" in quote[0].text,
                   "the echoed user HTML is shown as text", repr(quote[0].text if quote else None))
        cases = self.js("""
            const r = window.minferRenderMarkdown;
            return [r('[x](javascript:alert(1))'), r('[x](https://a.b/" onmouseover="alert(1))'),
                    r('a <script>alert(1)</script> b'), r('**<i>x</i>**'), r('```\\nunclosed <b>')];
        """)
        bad = [c for c in cases if any(s in c for s in ("<script", "<i>", "<b>", 'href="javascript', '" onmouseover'))]
        self.check(not bad, "the Markdown renderer escapes hostile input", repr(cases))

    def check_fake_errors(self):
        n = len(self.assistants())
        box = self.el("#input")
        box.send_keys("[[http-error]] please")
        self.el("#send").click()
        self.wait(lambda: self.el("#error").text, 10, "#error to show the HTTP error")
        self.check("fake error requested" in self.el("#error").text, "a non-200 JSON error is shown in #error",
                   repr(self.el("#error").text))
        self.wait(lambda: self.el("#send").is_enabled(), 5, "Send to be enabled after the error")
        self.check(len(self.assistants()) == n, "a failed request leaves no empty assistant message")
        self.send("[[stream-error]] please")
        cls, text, _ = self.watch_reply(self.args.reply_timeout)
        self.check("error" in cls and text.strip() and "middle of the stream" in self.el("#error").text,
                   "an in-stream error frame is shown, with the partial reply kept",
                   f"classes {cls}; #error {self.el('#error').text!r}")
        # The next successful send clears the banner.
        self.send("And one more.")
        cls, _, _ = self.watch_reply(self.args.reply_timeout)
        self.check("done" in cls and not self.el("#error").text, "the error banner clears on the next good reply")

    def report_failure(self):
        if not self.driver:
            return
        try:
            for entry in self.driver.get_log("browser")[-20:]:
                print(f"#   console {entry.get('level')}: {entry.get('message')}", file=sys.stderr)
        except WebDriverException:
            pass
        if self.args.screenshot:
            try:
                self.driver.save_screenshot(self.args.screenshot)
                print(f"#   screenshot: {self.args.screenshot}", file=sys.stderr)
            except WebDriverException:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="base URL of a running server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--fake", action="store_true", help="the server is fake_server.py: also run its checks")
    ap.add_argument("--api-key", help="type this into the page's API key field")
    ap.add_argument("--short-tokens", type=int, default=None,
                    help="max_tokens for normal replies (default: 48 against a real server, the page default with --fake)")
    ap.add_argument("--long-tokens", type=int, default=3000,
                    help="max_tokens for the reply that is stopped (prompt and reply within the 4096-token context: past it the server refuses the request)")
    ap.add_argument("--reply-timeout", type=float, default=120, help="seconds a reply may take")
    ap.add_argument("--screenshot", default=os.environ.get("CHAT_PAGE_SCREENSHOT", "/tmp/chat-page-failure.png"),
                    help="where to save a screenshot on failure")
    ap.add_argument("--chromium", help="browser binary (default: chromium on PATH)")
    ap.add_argument("--chromedriver", help="driver binary (default: chromedriver on PATH)")
    args = ap.parse_args()
    if args.short_tokens is None and not args.fake:
        args.short_tokens = 48

    t = Test(args)
    failed = 0
    try:
        t.run()
    except Failure as e:
        failed = 1
        print(f"not ok {t.passed + 1} - {e}", flush=True)
        t.report_failure()
    except Exception as e:  # noqa: BLE001 - a crash is a failure with its reason
        failed = 1
        print(f"not ok {t.passed + 1} - {type(e).__name__}: {e}", flush=True)
        t.report_failure()
    finally:
        if t.driver:
            t.driver.quit()
    print(f"chat-page: {t.passed} passed, {failed} failed", flush=True)
    if failed:
        print("FAIL: chat page test (see the `not ok` line above)", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
