import queue, sys, threading, time
def ponger(a, b):
    while a.get() is not None:
        b.put(1)
def main():
    secs = float(sys.argv[1])
    a, b = queue.Queue(), queue.Queue()
    t = threading.Thread(target=ponger, args=(a, b))
    t.start()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        a.put(1)
        b.get()
        n += 1
    a.put(None)
    t.join()
    print(n / (time.perf_counter() - t0))
main()
