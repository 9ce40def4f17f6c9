import os, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_work import squares, work

def napper():
    while True:
        time.sleep(0.002)
        squares(2000)

os.sched_setaffinity(0, {int(sys.argv[2])})
for _ in range(2):
    threading.Thread(target=napper, daemon=True).start()
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    work()
