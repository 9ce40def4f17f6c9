import sys, time
def busy_loop():
    t0 = time.time()
    x = 0
    while time.time() - t0 < float(sys.argv[1]):
        for i in range(1000):
            x += i
busy_loop()
