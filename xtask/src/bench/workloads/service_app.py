"""A threaded WSGI service: JSON rendering, a little CPU work, a lock, and a short I/O wait."""
import hashlib
import json
import threading
import time

from flask import Flask, jsonify, request

app = Flask(__name__)
_lock = threading.Lock()
_cache = {}


def render(n):
    items = [{"id": i, "name": f"item-{i}", "tags": ["a", "b", str(i % 7)]} for i in range(n)]
    return json.dumps(items)


def digest(payload):
    h = hashlib.sha256()
    for _ in range(20):
        h.update(payload.encode())
    return h.hexdigest()


@app.route("/")
def index():
    n = int(request.args.get("n", 60))
    body = render(n)
    with _lock:
        _cache[n] = _cache.get(n, 0) + 1
    time.sleep(0.002)
    return jsonify(size=len(body), digest=digest(body))
