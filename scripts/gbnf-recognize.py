#!/usr/bin/env python3
"""An independent GBNF recognizer (issue 16): reads llama.cpp's GBNF with its own parser
and runs an Earley recognizer over code points, so it shares no code with minfer's
GBNF-to-Lark translation or with llguidance.

Input: JSON lines {"grammar": path, "text": s, "expect": "accept" | "prefix" | "reject"}:
accept = the whole text is in the language; prefix = it can be continued into it (a reply
cut by the token limit); reject = neither. Prints mismatches and a summary; exit 1 on any."""

import json
import sys


class Grammar:
    def __init__(self, src):
        self.s, self.i = src, 0
        self.rules = {}  # name -> list of alternatives (tuples of symbols)
        self.aux = 0
        # Symbols: ("nt", name) or ("t", negated, ranges)
        self.space(True)
        while self.i < len(self.s):
            name = self.name()
            if not name:
                raise ValueError("rule name expected at %d" % self.i)
            self.space(False)
            if not self.s.startswith("::=", self.i):
                raise ValueError("::= expected after %s" % name)
            self.i += 3
            self.space(True)
            self.rules[name] = self.alts(False)
            self.space(True)
        if "root" not in self.rules:
            raise ValueError("no root")

    def space(self, nl):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (nl and c in "\r\n"):
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def name(self):
        j = self.i
        while self.i < len(self.s) and (self.s[self.i].isalnum() or self.s[self.i] in "-_"):
            self.i += 1
        return self.s[j:self.i]

    def char(self):
        c = self.s[self.i]
        self.i += 1
        if c != "\\":
            return c
        e = self.s[self.i]
        self.i += 1
        if e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            v = int(self.s[self.i:self.i + n], 16)
            self.i += n
            return chr(v)
        return {"t": "\t", "r": "\r", "n": "\n"}.get(e, e)

    def new_rule(self, alts):
        self.aux += 1
        name = " aux%d" % self.aux
        self.rules[name] = alts
        return ("nt", name)

    def alts(self, nested):
        out = [self.seq(nested)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            self.space(True)
            out.append(self.seq(nested))
        return out

    def seq(self, nested):
        out = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                while self.s[self.i] != '"':
                    ch = self.char()
                    out.append(("t", False, ((ch, ch),)))
                self.i += 1
            elif c == "[":
                self.i += 1
                neg = self.s[self.i] == "^"
                if neg:
                    self.i += 1
                rng = []
                while self.s[self.i] != "]":
                    lo = self.char()
                    hi = lo
                    if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                        self.i += 1
                        hi = self.char()
                    rng.append((lo, hi))
                self.i += 1
                out.append(("t", neg, tuple(rng)))
            elif c == ".":
                self.i += 1
                out.append(("t", True, ()))
            elif c == "(":
                self.i += 1
                self.space(True)
                alts = self.alts(True)
                assert self.s[self.i] == ")"
                self.i += 1
                out.append(self.new_rule(alts))
            elif c in "*+?{":
                self.i += 1
                x = out.pop()
                if c == "{":
                    body = self.s[self.i:self.s.index("}", self.i)]
                    self.i += len(body) + 1
                    if "," in body:
                        a, b = body.split(",")
                        lo, hi = int(a.strip() or 0), (int(b) if b.strip() else None)
                    else:
                        lo = hi = int(body)
                else:
                    lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                out.append(self.repeat(x, lo, hi))
            else:
                j = self.i
                n = self.name()
                if not n:
                    break
                k = self.i
                self.space(False)
                if self.s.startswith("::=", self.i):
                    self.i = j
                    break
                self.i = k
                out.append(("nt", n))
            self.space(nested)
        return tuple(out)

    def repeat(self, x, lo, hi):
        if hi is None:
            star = self.new_rule([()])
            self.rules[star[1]] = [(), (x, star)]
            return self.new_rule([tuple([x] * lo) + (star,)])
        # lo copies, then up to hi - lo optional ones, nested: (x (x ...)?)?
        tail = ()
        for _ in range(hi - lo):
            tail = (self.new_rule([(), (x,) + tail]),)
        return self.new_rule([tuple([x] * lo) + tail])


def matches(sym, ch):
    _, neg, ranges = sym
    hit = any(lo <= ch <= hi for lo, hi in ranges)
    return hit != neg


def recognize(g, text):
    """(accepted, viable prefix) by Earley with the Aycock-Horspool nullable rule."""
    nullable = set()
    changed = True
    while changed:
        changed = False
        for a, alts in g.rules.items():
            if a not in nullable and any(all(s[0] == "nt" and s[1] in nullable for s in alt) for alt in alts):
                nullable.add(a)
                changed = True
    charts = [set() for _ in range(len(text) + 1)]

    def closure(i):
        work = list(charts[i])
        while work:
            a, alt, dot, org = work.pop()
            if dot < len(alt):
                s = alt[dot]
                if s[0] == "nt":
                    new = [(s[1], b, 0, i) for b in g.rules[s[1]]]
                    if s[1] in nullable:
                        new.append((a, alt, dot + 1, org))
                    for it in new:
                        if it not in charts[i]:
                            charts[i].add(it)
                            work.append(it)
            else:
                for (b, alt2, d2, o2) in list(charts[org]):
                    if d2 < len(alt2) and alt2[d2] == ("nt", a):
                        it = (b, alt2, d2 + 1, o2)
                        if it not in charts[i]:
                            charts[i].add(it)
                            work.append(it)

    for alt in g.rules["root"]:
        charts[0].add(("root", alt, 0, 0))
    closure(0)
    for i, ch in enumerate(text):
        for (a, alt, dot, org) in charts[i]:
            if dot < len(alt) and alt[dot][0] == "t" and matches(alt[dot], ch):
                charts[i + 1].add((a, alt, dot + 1, org))
        if not charts[i + 1]:
            return False, False
        closure(i + 1)
    n = len(text)
    accepted = any(a == "root" and dot == len(alt) and org == 0 for (a, alt, dot, org) in charts[n])
    return accepted, True


cache = {}
bad = n = 0
for line in sys.stdin:
    case = json.loads(line)
    n += 1
    path = case["grammar"]
    if path not in cache:
        with open(path, encoding="utf-8") as fh:
            cache[path] = Grammar(fh.read())
    acc, viable = recognize(cache[path], case["text"])
    got = "accept" if acc else ("prefix" if viable else "reject")
    want = case["expect"]
    # A reply cut by the limit may also happen to be complete.
    ok = got == want or (want == "prefix" and got == "accept")
    if not ok:
        bad += 1
        print("MISMATCH %s: expected %s, got %s: %r" % (path, want, got, case["text"]))
print("%d passed, %d failed" % (n - bad, bad))
sys.exit(1 if bad else 0)
