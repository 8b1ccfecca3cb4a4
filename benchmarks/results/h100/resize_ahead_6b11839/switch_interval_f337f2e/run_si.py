"""python3 .device/run_si.py SECONDS script.py ARGS...: run the script with the interpreter's switch interval set."""
import runpy
import sys

sys.setswitchinterval(float(sys.argv[1]))
sys.argv = sys.argv[2:]
sys.path.insert(0, "benchmarks")
runpy.run_path(sys.argv[0], run_name="__main__")
