import asyncio, random, sys, time

done = 0

async def io_wait(r):
    await asyncio.sleep(r.uniform(0.005, 0.05))

async def handle(r):
    global done
    x = 0
    for i in range(200):
        x += i
    await io_wait(r)
    done += 1

async def worker(i, end):
    r = random.Random(i)
    while time.monotonic() < end:
        await handle(r)

async def main(n, secs):
    end = time.monotonic() + secs
    await asyncio.gather(*(asyncio.create_task(worker(i, end), name=f"conn-{i}")
                           for i in range(n)))
    print(done / secs)

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
