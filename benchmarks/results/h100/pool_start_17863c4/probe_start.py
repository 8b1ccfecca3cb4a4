"""Where the decoding process pool's start goes on this host: the fork server, then the workers."""
import sys, time, os
sys.path.insert(0, ".")
def main():
    t0 = time.perf_counter()
    from concurrent.futures import ProcessPoolExecutor
    from clip_flash.inputs import decode_pool
    t_import = time.perf_counter() - t0
    ctx = decode_pool.process_context()
    t1 = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=ctx) as one:
        one.submit(os.getpid).result()
    t_server = time.perf_counter() - t1
    t2 = time.perf_counter()
    n = int(sys.argv[1])
    with ProcessPoolExecutor(n, mp_context=ctx) as many:
        futures = [many.submit(time.sleep, 0.05) for _ in range(n)]
        [f.result() for f in futures]
        t_workers = time.perf_counter() - t2
        t3 = time.perf_counter()
        futures = [many.submit(os.getpid) for _ in range(4 * n)]
        [f.result() for f in futures]
        t_again = time.perf_counter() - t3
    print(f"import decode_pool {t_import:.2f} s; fork server + 1 worker {t_server:.2f} s; {n} workers {t_workers:.2f} s; tasks on warm workers {t_again:.3f} s")

if __name__ == '__main__':
    main()