import json, os, sys, time
script, iters, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# The workload as a module (its main() runs only as a script): its functions, timed one by one.
g = {"__name__": "bench_work"}
exec(compile(open(script).read(), script, "exec"), g)
squares, fib, c_heavy = g["squares"], g["fib"], g["c_heavy"]
os.sched_setaffinity(0, {cpu})
tt = {"squares": 0.0, "fib": 0.0, "c_heavy": 0.0}
for _ in range(iters):
    t = time.thread_time(); squares(60000); tt["squares"] += time.thread_time() - t
    t = time.thread_time(); fib(16); tt["fib"] += time.thread_time() - t
    t = time.thread_time(); c_heavy(); tt["c_heavy"] += time.thread_time() - t
total = sum(tt.values())
print(json.dumps({k: 100 * v / total for k, v in tt.items()}))
