#!/usr/bin/env python3
"""Real-browser test of the `minfer viz` page (headless Chromium through selenium).

Against a running `minfer viz` at --url: the page loads with no console errors, its graph
has --expect-nodes operator nodes (the model's decode graph, counted by the caller from
`minfer run --dump-graph-json`), a run streams tokens and per-step stats, the filters hide
and show the attention path, the step slider moves, clicking a node opens its inspector
with a sparkline, an input link moves to that node and Back returns. With --replay the
server replays a saved trace: a run plays its phases back; with --expect-diff NODE (the
server got `--diff B`) the trace-diff box must mark exactly NODE and the page must show it
in its step after the replay. Screenshots go to --shots.

Usually run through scripts/test-viz-page, which builds what it needs and starts servers.
Prints one line per check; exits non-zero on the first failure.
"""

import argparse
import json
import os
import shutil
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


class Failure(Exception):
    pass


class Test:
    def __init__(self, args):
        self.args = args
        self.url = args.url.rstrip("/")
        self.passed = 0
        self.driver = None

    def ok(self, what):
        self.passed += 1
        print(f"ok {self.passed} - {what}", flush=True)

    def check(self, cond, what, detail=""):
        if not cond:
            raise Failure(what + (f": {detail}" if detail else ""))
        self.ok(what)

    def wait(self, cond, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                raise Failure(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.05)

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def text(self, css):
        return self.driver.find_element(By.CSS_SELECTOR, css).text

    def shot(self, name):
        os.makedirs(self.args.shots, exist_ok=True)
        path = os.path.join(self.args.shots, name)
        self.driver.save_screenshot(path)
        print(f"#   screenshot: {path}", flush=True)

    def console_errors(self):
        return [e for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]

    def start_browser(self):
        chromium = self.args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
        driver = self.args.chromedriver or shutil.which("chromedriver")
        if not chromium or not driver:
            raise Failure("chromium and chromedriver must be on PATH (scripts/ensure-chromium)")
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                  "--window-size=1400,900", "--no-first-run", "--disable-extensions"):
            opts.add_argument(a)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(executable_path=driver), options=opts)

    def run(self):
        graph = json.load(urllib.request.urlopen(self.url + "/viz/graph", timeout=10))
        n_graph = len(graph["nodes"])
        if self.args.expect_nodes is not None:
            self.check(n_graph == self.args.expect_nodes, "GET /viz/graph has the model's node count",
                       f"{n_graph} != {self.args.expect_nodes}")
        self.start_browser()
        d = self.driver
        d.get(self.url + "/")
        self.wait(lambda: self.js("return document.body.dataset.nodes"), 20, "the graph to load")
        drawn = self.js("return document.querySelectorAll('#graph .node').length")
        self.check(drawn == n_graph, "the page draws every node of the graph", f"{drawn} != {n_graph}")
        fused = self.js("return document.querySelectorAll('#graph .node.fused').length")
        want_fused = sum(1 for n in graph["nodes"] if n["fused"])
        self.check(fused == want_fused, "fused nodes are marked", f"{fused} != {want_fused}")
        self.wait(lambda: "connected" in self.text("#status") or "replay" in self.text("#status"),
                  10, "the event stream")
        self.ok("the event stream is connected")
        want = self.args.expect_diff
        if want:
            self.wait(lambda: self.js("return !document.getElementById('diff-box').classList.contains('hidden')"),
                      10, "the trace-diff box")
            marked = self.js("return [...document.querySelectorAll('#graph .node.diff')].map(e => e.dataset.name)")
            self.check(marked == [want], f"the trace-diff view marks {want}", f"marked {marked}")
            self.check(want in self.text("#diff-text"), "and names it", self.text("#diff-text"))
        self.shot("viz-loaded.png")

        # A run: tokens stream in, steps arrive.
        d.find_element(By.ID, "max-tokens").clear()
        d.find_element(By.ID, "max-tokens").send_keys(str(self.args.max_tokens))
        d.find_element(By.ID, "run").click()
        self.wait(lambda: len(d.find_elements(By.CSS_SELECTOR, "#tokens .tok")) > 0, self.args.timeout,
                  "the first token")
        self.ok("a run streams tokens")
        self.wait(lambda: "finish" in self.text("#run-stats"), self.args.timeout, "the run's end")
        n_tok = len(d.find_elements(By.CSS_SELECTOR, "#tokens .tok"))
        self.check(n_tok >= 1, f"the run ended with {n_tok} tokens shown", self.text("#run-stats"))
        steps = int(self.js("return state.steps.length"))
        self.check(steps >= 1, f"{steps} steps of node stats arrived")
        self.check("step" in self.text("#step-label"), "the step label shows the step")
        if want:
            self.wait(lambda: self.text("#insp-name") == want, 5, "the diff node's inspector")
            phase = int(self.js("return state.diff.at.phase"))
            self.check(int(self.js("return state.step")) == phase,
                       f"after the replay the page shows the differing node in its step ({phase})")
        self.shot("viz-after-run.png")

        # Filters: the attention path hides and comes back.
        attn = self.js("return document.querySelectorAll('#graph .node[data-role=attention]').length")
        d.find_element(By.ID, "f-attn").click()
        hidden = self.js("return document.querySelectorAll('#graph .node[data-role=attention].hidden').length")
        self.check(attn > 0 and hidden == attn, "the attention filter hides the attention path",
                   f"{hidden} of {attn}")
        d.find_element(By.ID, "f-attn").click()
        hidden = self.js("return document.querySelectorAll('#graph .node.hidden').length")
        self.check(hidden == 0, "turning it back on shows every node", f"{hidden} hidden")

        # Playback: the first step.
        if steps > 1:
            before = int(self.js("return state.step"))
            if before > 0:
                d.find_element(By.ID, "step-prev").click()
                self.check(int(self.js("return state.step")) == before - 1, "step back moves one step")
            else:
                d.find_element(By.ID, "step-next").click()
                self.check(int(self.js("return state.step")) == 1, "step forward moves one step")

        # The inspector, its inputs and the back stack.
        target = self.args.node
        el = d.find_element(By.CSS_SELECTOR, f"#graph .node[data-name='{target}'] rect")
        el.click()
        self.wait(lambda: self.text("#insp-name") == target, 5, "the inspector")
        self.check(self.text("#insp-op") != "", f"the inspector opens on {target}: {self.text('#insp-op')}")
        stats = self.text("#insp-stats")
        self.check("min" in stats and "max" in stats, "it shows the node's stats", stats)
        self.check(len(d.find_elements(By.CSS_SELECTOR, "#sparkline path")) == 1, "and a sparkline")
        links = d.find_elements(By.CSS_SELECTOR, "#insp-inputs a")
        if links:
            other = links[0].text
            links[0].click()
            self.wait(lambda: self.text("#insp-name") == other, 5, "the input's inspector")
            d.find_element(By.ID, "inspector-back").click()
            self.wait(lambda: self.text("#insp-name") == target, 5, "back to the first node")
            self.ok(f"an input link opens {other} and Back returns to {target}")
        self.shot("viz-inspector.png")

        d.find_element(By.ID, "view-pipeline").click()
        cells = self.js("return document.querySelectorAll('#pipeline .cell').length")
        self.check(cells > 0, f"the per-layer pipeline view draws {cells} cells")
        self.shot("viz-pipeline.png")

        d.find_element(By.ID, "view-timeline").click()
        bars = self.js("return document.querySelectorAll('#timeline .tbar').length")
        timed = int(self.js("return state.steps[state.step].nodes.filter(s => typeof s.ns === 'number').length"))
        self.check(bars == timed, f"the timeline draws a bar per timed node ({bars})", f"{bars} != {timed}")
        if self.args.expect_times:
            self.check(timed > 0, "the node times arrived")
        b = self.args.expect_timed_backend
        if b:
            on_b = int(self.js(f"return state.steps[state.step].nodes.filter(s => s.backend === '{b}' && s.ns > 0).length"))
            self.check(on_b > 0, f"{b} nodes have times ({on_b})")
            bars_b = self.js(f"return [...document.querySelectorAll('#timeline .tbar')].filter(r => r.getAttribute('fill') === backendColour('{b}')).length")
            self.check(bars_b == on_b, f"the timeline draws a bar per timed {b} node ({bars_b})", f"{bars_b} != {on_b}")
            src = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#timeline .tsource")]
            line = next((t for t in src if t.startswith(b + ":")), "")
            self.check(line and "not stated" not in line, f"the timeline says what {b}'s times are: {line}", "; ".join(src))
        self.shot("viz-timeline.png")

        errs = self.console_errors()
        self.check(not errs, "no console errors", "; ".join(e.get("message", "") for e in errs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--expect-nodes", type=int)
    ap.add_argument("--expect-times", action="store_true", help="steps must carry node times")
    ap.add_argument("--expect-timed-backend", help="this backend's nodes must be timed and drawn, its time source named")
    ap.add_argument("--expect-diff", help="the node the trace-diff view must mark (replay --diff)")
    ap.add_argument("--node", default="L0.attn_norm", help="the node whose inspector is opened")
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--shots", default="target/viz-page")
    ap.add_argument("--chromium")
    ap.add_argument("--chromedriver")
    args = ap.parse_args()
    t = Test(args)
    try:
        t.run()
    except Failure as e:
        print(f"not ok {t.passed + 1} - {e}", flush=True)
        if t.driver:
            for entry in t.driver.get_log("browser")[-20:]:
                print(f"#   console {entry.get('level')}: {entry.get('message')}", file=sys.stderr)
            t.shot("viz-failure.png")
        print(f"viz-page: {t.passed} passed, 1 failed")
        sys.exit(1)
    finally:
        if t.driver:
            t.driver.quit()
    print(f"viz-page: {t.passed} passed, 0 failed")


if __name__ == "__main__":
    main()
