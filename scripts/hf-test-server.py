#!/usr/bin/env python3
"""A loopback stand-in for the Hugging Face hub, for minfer's download tests (issue 17).

Serves the repositories under ROOT (ROOT/OWNER/REPO/...) with the hub's URL layout:

  GET /api/models/OWNER/REPO/tree/REV[?recursive=true]
      JSON array of {type, oid, size, path[, lfs: {oid, size, pointerSize}]}; *.gguf and
      *.safetensors are "LFS" files whose lfs.oid is their SHA-256. With --page-size N the
      listing is paged and continues at the Link: <...>; rel="next" URL.
  GET /OWNER/REPO/resolve/REV/PATH
      LFS files: 302 to /cdn/OWNER/REPO/PATH with X-Linked-Size and X-Linked-Etag (as the
      hub redirects to its CDN); other files are served directly.
  GET /cdn/OWNER/REPO/PATH
      the bytes, with ETag, Accept-Ranges, Range (206 + Content-Range, 416) and If-Range.

Faults, for the tests: --cut PATH=N closes the connection after N bytes of every transfer
of PATH (a client that resumes gets N more bytes each time); --corrupt PATH flips one byte of what is served for PATH
(the listing still gives the true hash); --token T answers 401 to API and resolve requests
without "Authorization: Bearer T" (the CDN needs none, as on the hub).

Every request is appended to --log as one JSON line {method, path, range, if_range, auth}.
Binds 127.0.0.1 only, on --port (0 = any free port), and prints "PORT <n>" when listening.
"""

import argparse
import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors")


def git_blob_oid(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    def __init__(self, args):
        self.root = os.path.realpath(args.root)
        self.token = args.token
        self.page_size = args.page_size
        self.cuts = dict(c.rsplit("=", 1) for c in args.cut)
        self.corrupt = set(args.corrupt)
        self.log_path = args.log
        self.lock = threading.Lock()
        self.sha_cache = {}

    def log(self, entry):
        if not self.log_path:
            return
        with self.lock, open(self.log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def repo_dir(self, owner, repo):
        d = os.path.realpath(os.path.join(self.root, owner, repo))
        if not d.startswith(self.root + os.sep) or not os.path.isdir(d):
            return None
        return d

    def file_path(self, repo_dir, rel):
        p = os.path.realpath(os.path.join(repo_dir, rel))
        if not p.startswith(repo_dir + os.sep) or not os.path.isfile(p):
            return None
        return p

    def sha256(self, path):
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        if key not in self.sha_cache:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            self.sha_cache[key] = h.hexdigest()
        return self.sha_cache[key]

    def listing(self, repo_dir, recursive):
        entries = []
        for dirpath, dirnames, filenames in os.walk(repo_dir):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, repo_dir)
            if rel_dir != "." and not recursive:
                continue
            if rel_dir != ".":
                entries.append({"type": "directory", "oid": "0" * 40, "size": 0,
                                "path": rel_dir.replace(os.sep, "/")})
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, repo_dir).replace(os.sep, "/")
                size = os.path.getsize(full)
                if name.endswith(LFS_SUFFIXES):
                    pointer = "version https://git-lfs.github.com/spec/v1\n"
                    pointer += "oid sha256:%s\nsize %d\n" % (self.sha256(full), size)
                    entries.append({"type": "file", "oid": git_blob_oid(pointer.encode()),
                                    "size": size, "path": rel,
                                    "lfs": {"oid": self.sha256(full), "size": size,
                                            "pointerSize": len(pointer)}})
                else:
                    with open(full, "rb") as f:
                        oid = git_blob_oid(f.read())
                    entries.append({"type": "file", "oid": oid, "size": size, "path": rel})
        return entries


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub = None  # set in main

    def log_message(self, fmt, *args):  # quiet: the JSON log is the record
        pass

    def send_json(self, status, obj, headers=()):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def authorized(self):
        if self.hub.token is None:
            return True
        return self.headers.get("Authorization") == "Bearer " + self.hub.token

    def do_GET(self):
        url = urlsplit(self.path)
        path = unquote(url.path)
        self.hub.log({"method": "GET", "path": path, "query": url.query,
                      "range": self.headers.get("Range"),
                      "if_range": self.headers.get("If-Range"),
                      "auth": self.headers.get("Authorization")})
        parts = path.strip("/").split("/")
        if len(parts) >= 5 and parts[0] == "api" and parts[1] == "models" and parts[4] == "tree":
            return self.tree(parts[2], parts[3], parse_qs(url.query))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(parts[0], parts[1], "/".join(parts[4:]))
        if len(parts) >= 4 and parts[0] == "cdn":
            return self.cdn(parts[1], parts[2], "/".join(parts[3:]))
        self.send_json(404, {"error": "not found"})

    def tree(self, owner, repo, query):
        if not self.authorized():
            return self.send_json(401, {"error": "Invalid credentials"})
        d = self.hub.repo_dir(owner, repo)
        if d is None:
            return self.send_json(404, {"error": "Repository not found"})
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        entries = self.hub.listing(d, recursive)
        headers = []
        if self.hub.page_size:
            start = int(query.get("cursor", ["0"])[0])
            end = start + self.hub.page_size
            if end < len(entries):
                nxt = "/api/models/%s/%s/tree/main?recursive=%s&cursor=%d" % (
                    owner, repo, "true" if recursive else "false", end)
                headers.append(("Link", '<%s>; rel="next"' % nxt))
            entries = entries[start:end]
        self.send_json(200, entries, headers)

    def resolve(self, owner, repo, rel):
        if not self.authorized():
            return self.send_json(401, {"error": "Invalid credentials"})
        d = self.hub.repo_dir(owner, repo)
        f = d and self.hub.file_path(d, rel)
        if not f:
            return self.send_json(404, {"error": "Entry not found"})
        if rel.endswith(LFS_SUFFIXES):
            self.send_response(302)
            self.send_header("Location", "/cdn/%s/%s/%s" % (owner, repo, quote(rel)))
            self.send_header("X-Linked-Size", str(os.path.getsize(f)))
            self.send_header("X-Linked-Etag", '"%s"' % self.hub.sha256(f))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.serve_file(f, rel)

    def cdn(self, owner, repo, rel):
        d = self.hub.repo_dir(owner, repo)
        f = d and self.hub.file_path(d, rel)
        if not f:
            return self.send_json(404, {"error": "not found"})
        self.serve_file(f, rel)

    def serve_file(self, f, rel):
        size = os.path.getsize(f)
        etag = '"%s"' % self.hub.sha256(f)
        start, status = 0, 200
        rng = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if rng and (if_range is None or if_range == etag):
            spec = rng.strip()
            if not spec.startswith("bytes=") or not spec[6:].endswith("-"):
                return self.send_json(400, {"error": "only bytes=N- ranges"})
            start = int(spec[6:-1])
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(size - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, size - 1, size))
        self.end_headers()
        cut = self.hub.cuts.get(rel)
        limit = int(cut) if cut is not None else None
        with open(f, "rb") as fh:
            fh.seek(start)
            sent, pos = 0, start
            while True:
                chunk = fh.read(1 << 16)
                if not chunk:
                    break
                if rel in self.hub.corrupt and pos <= size // 2 < pos + len(chunk):
                    i = size // 2 - pos
                    chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
                if limit is not None and sent + len(chunk) >= limit:
                    self.wfile.write(chunk[: limit - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    # Drop the connection mid-body, as a network failure would.
                    self.connection.shutdown(2)
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
                pos += len(chunk)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token")
    ap.add_argument("--page-size", type=int, default=0)
    ap.add_argument("--cut", action="append", default=[], metavar="PATH=BYTES")
    ap.add_argument("--corrupt", action="append", default=[], metavar="PATH")
    ap.add_argument("--log")
    args = ap.parse_args()
    Handler.hub = Hub(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("PORT %d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
