import hashlib, json, os, sys, time, zlib

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def squares(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

DOC = {"items": [{"id": i, "name": "item-%d" % i, "tags": ["a", "b", "c"], "price": i * 0.5}
                 for i in range(400)]}

def c_heavy():
    text = json.dumps(DOC)
    blob = zlib.compress(text.encode() * 4, 6)
    digest = hashlib.sha256(blob * 8).hexdigest()
    order = sorted(DOC["items"], key=lambda d: (d["price"] % 7, d["id"]))
    return len(json.loads(text)["items"]) + len(digest) + order[0]["id"]

def work():
    return squares(60000) + fib(16) + c_heavy()

def main():
    if len(sys.argv) > 2:
        os.sched_setaffinity(0, {int(sys.argv[2])})
    t0 = time.perf_counter()
    for _ in range(int(sys.argv[1])):
        work()
    print(time.perf_counter() - t0)

if __name__ == "__main__":
    main()
