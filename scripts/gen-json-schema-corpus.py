#!/usr/bin/env python3
"""Writes the JSON Schema corpus of crates/generate/tests/json_schema_corpus.rs (issue 16):
60 schemas of real-world shape (API payloads, configs, records), each with short instances
(bounded strings and arrays) so a constrained reply finishes within a small token budget.
Run from the repository root: scripts/gen-json-schema-corpus.py"""

import json
import os

S = lambda n=16, **kw: {"type": "string", "maxLength": n, **kw}
I = lambda lo=None, hi=None: {"type": "integer", **({"minimum": lo} if lo is not None else {}), **({"maximum": hi} if hi is not None else {})}
N = lambda lo=None, hi=None: {"type": "number", **({"minimum": lo} if lo is not None else {}), **({"maximum": hi} if hi is not None else {})}
B = {"type": "boolean"}
E = lambda *v: {"enum": list(v)}
A = lambda items, lo=0, hi=3: {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


def O(props, required=None, extra=False, title=None):
    o = {"type": "object", "properties": props, "required": list(props) if required is None else required,
         "additionalProperties": extra}
    if title:
        o["title"] = title
    return o


ADDRESS = O({"street": S(20), "city": S(14), "zip": S(8, pattern="^[0-9]{5}$"), "country": E("US", "FR", "DE", "JP")})
GEO = O({"lat": N(-90, 90), "lon": N(-180, 180)})
MONEY = O({"amount": N(0, 100000), "currency": E("USD", "EUR", "JPY")})

corpus = [
    ("user profile", O({"id": I(1, 99999), "name": S(16), "email": S(24, format="email"), "active": B})),
    ("postal address", ADDRESS),
    ("geo point", GEO),
    ("price", MONEY),
    ("todo item", O({"title": S(20), "done": B, "priority": E("low", "medium", "high")})),
    ("http error", O({"error": O({"code": I(400, 599), "message": S(24)})})),
    ("pagination", O({"page": I(1, 100), "per_page": E(10, 25, 50), "total": I(0, 10000)})),
    ("feature flags", O({"flags": A(O({"name": S(12), "enabled": B}), 1, 3)})),
    ("rgb colour", O({"r": I(0, 255), "g": I(0, 255), "b": I(0, 255)})),
    ("semver", O({"major": I(0, 99), "minor": I(0, 99), "patch": I(0, 99), "pre": S(8)}, ["major", "minor", "patch"])),
    ("book", O({"title": S(20), "author": S(16), "year": I(1450, 2030), "isbn": S(13, pattern="^[0-9]{13}$")})),
    ("movie", O({"title": S(20), "year": I(1888, 2030), "genres": A(E("drama", "comedy", "action", "horror"), 1, 2), "rating": N(0, 10)})),
    ("recipe", O({"name": S(16), "servings": I(1, 12), "ingredients": A(O({"item": S(12), "grams": I(1, 2000)}), 1, 3)})),
    ("calendar event", O({"title": S(16), "date": {"type": "string", "format": "date"}, "all_day": B})),
    ("employee", O({"name": S(16), "role": E("engineer", "manager", "designer"), "manager": {"anyOf": [S(16), {"type": "null"}]}})),
    ("bank transaction", O({"id": {"type": "string", "format": "uuid"}, "amount": MONEY, "kind": E("debit", "credit")})),
    ("sensor reading", O({"sensor": S(10), "celsius": N(-50, 150), "ok": B})),
    ("log entry", O({"level": E("debug", "info", "warn", "error"), "message": S(24), "code": I(0, 999)})),
    ("server config", O({"host": S(16), "port": I(1, 65535), "tls": B, "workers": I(1, 64)})),
    ("database url parts", O({"scheme": E("postgres", "mysql", "sqlite"), "host": S(16), "port": I(1, 65535), "db": S(12)})),
    ("shopping cart", O({"items": A(O({"sku": S(8), "qty": I(1, 99)}), 1, 3), "coupon": {"anyOf": [S(8), {"type": "null"}]}})),
    ("order", O({"order_id": I(1, 10**6), "status": E("new", "paid", "shipped"), "total": MONEY, "ship_to": ADDRESS})),
    ("invoice line", O({"description": S(20), "quantity": I(1, 100), "unit_price": N(0, 10000)})),
    ("weather now", O({"city": S(14), "temp_c": N(-60, 60), "condition": E("sunny", "cloudy", "rain", "snow"), "wind_kph": I(0, 300)})),
    ("weather forecast", O({"city": S(14), "days": A(O({"day": I(1, 7), "high": I(-60, 60), "low": I(-60, 60)}), 1, 3)})),
    ("contact card", O({"name": S(16), "phones": A(O({"kind": E("home", "work", "mobile"), "number": S(14)}), 0, 2)})),
    ("github issue", O({"number": I(1, 99999), "title": S(24), "state": E("open", "closed"), "labels": A(S(10), 0, 3)})),
    ("pull request", O({"number": I(1, 99999), "draft": B, "reviewers": A(S(12), 0, 2), "mergeable": {"anyOf": [B, {"type": "null"}]}})),
    ("api key", O({"key_id": {"type": "string", "format": "uuid"}, "scopes": A(E("read", "write", "admin"), 1, 3), "expires_days": I(1, 365)})),
    ("oauth token", O({"access_token": S(20), "token_type": {"const": "Bearer"}, "expires_in": I(60, 86400)})),
    ("network interface", O({"name": S(8), "ipv4": {"type": "string", "format": "ipv4"}, "up": B, "mtu": I(576, 9000)})),
    ("docker service", O({"image": S(20), "ports": A(I(1, 65535), 0, 3), "restart": E("no", "always", "on-failure")})),
    ("cron job", O({"name": S(12), "schedule": S(16), "enabled": B})),
    ("student grade", O({"student": S(16), "course": S(12), "grade": E("A", "B", "C", "D", "F"), "score": I(0, 100)})),
    ("flight", O({"flight": S(7, pattern="^[A-Z]{2}[0-9]{1,4}$"), "from": S(3, pattern="^[A-Z]{3}$"), "to": S(3, pattern="^[A-Z]{3}$"), "seats_left": I(0, 500)})),
    ("hotel booking", O({"hotel": S(16), "nights": I(1, 30), "guests": I(1, 8), "breakfast": B})),
    ("survey answer", O({"question": I(1, 50), "answer": {"anyOf": [I(1, 5), S(20)]}})),
    ("chat message", O({"role": E("user", "assistant", "system"), "content": S(24)})),
    ("tool call", O({"name": E("search", "lookup", "calculate"), "arguments": O({"query": S(20)})})),
    ("search result", O({"results": A(O({"title": S(16), "score": N(0, 1)}), 1, 3)})),
    ("metric sample", O({"name": S(16), "value": N(), "labels": O({"env": E("prod", "dev")})})),
    ("health check", O({"status": E("pass", "warn", "fail"), "checks": A(O({"name": S(10), "ok": B}), 1, 3)})),
    ("product", O({"sku": S(10), "name": S(16), "price": MONEY, "tags": A(S(8), 0, 3), "in_stock": B})),
    ("review", O({"product": S(12), "stars": I(1, 5), "text": S(24)})),
    ("vehicle", O({"make": S(12), "model": S(12), "year": I(1900, 2030), "fuel": E("petrol", "diesel", "electric", "hybrid")})),
    ("medication", O({"name": S(16), "dose_mg": N(0, 2000), "per_day": I(1, 6)})),
    ("country", O({"code": S(2, pattern="^[A-Z]{2}$"), "name": S(16), "population": I(0, 2 * 10**9), "capital": GEO})),
    ("timezone", O({"name": S(20), "utc_offset_minutes": I(-720, 840), "dst": B})),
    ("file entry", O({"path": S(24), "size": I(0, 10**9), "kind": E("file", "dir", "link")})),
    ("git commit", O({"sha": S(7, pattern="^[0-9a-f]{7}$"), "message": S(24), "files_changed": I(0, 999)})),
    ("playlist", O({"name": S(16), "tracks": A(O({"title": S(14), "seconds": I(1, 3600)}), 1, 3)})),
    ("game score", O({"player": S(12), "score": I(0, 10**7), "level": I(1, 100), "won": B})),
    ("shape (anyOf)", {"anyOf": [O({"kind": {"const": "circle"}, "radius": N(0, 100)}),
                                 O({"kind": {"const": "rect"}, "w": N(0, 100), "h": N(0, 100)})]}),
    ("payment (oneOf)", {"oneOf": [O({"method": {"const": "card"}, "last4": S(4, pattern="^[0-9]{4}$")}),
                                   O({"method": {"const": "iban"}, "country": S(2, pattern="^[A-Z]{2}$")})]}),
    ("person with $defs", {"$defs": {"addr": ADDRESS}, "type": "object",
                           "properties": {"name": S(16), "home": {"$ref": "#/$defs/addr"}},
                           "required": ["name", "home"], "additionalProperties": False}),
    ("team with $ref list", {"$defs": {"member": O({"name": S(12), "role": E("lead", "dev")})}, "type": "object",
                             "properties": {"team": S(12), "members": {"type": "array", "items": {"$ref": "#/$defs/member"}, "minItems": 1, "maxItems": 2}},
                             "required": ["team", "members"], "additionalProperties": False}),
    ("tree node (recursive $ref)", {"$defs": {"node": {"type": "object", "properties": {"label": S(6), "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1}},
                                                       "required": ["label"], "additionalProperties": False}},
                                    "$ref": "#/$defs/node"}),
    ("key-value map", {"type": "object", "additionalProperties": I(0, 100), "maxProperties": 3}),
    ("settings with extras", O({"theme": E("light", "dark")}, ["theme"], extra=S(8))),
    ("coordinates tuple", {"type": "array", "prefixItems": [N(-90, 90), N(-180, 180)], "items": False, "minItems": 2}),
    ("optional fields", O({"id": I(1, 999), "nickname": S(12), "age": I(0, 130)}, ["id"])),
]

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "engine", "tests", "data", "json_schemas")
os.makedirs(here, exist_ok=True)
for f in os.listdir(here):
    if f.endswith(".json"):
        os.remove(os.path.join(here, f))
for i, (title, schema) in enumerate(corpus):
    schema = dict(schema)
    schema.setdefault("title", title)
    name = "%02d-%s.json" % (i + 1, "".join(c if c.isalnum() else "-" for c in title.split(" (")[0]).strip("-"))
    with open(os.path.join(here, name), "w") as fh:
        json.dump(schema, fh, indent=1)
        fh.write("\n")
print(len(corpus), "schemas")
