import sys, threading, time
def napper(secs):
    t0 = time.time()
    while time.time() - t0 < secs:
        time.sleep(0.0005)
ts = [threading.Thread(target=napper, args=(float(sys.argv[1]),)) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
