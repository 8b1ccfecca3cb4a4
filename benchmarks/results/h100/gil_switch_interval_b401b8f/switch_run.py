"""Run a script with sys.setswitchinterval(float(env SWITCH))."""
import os, runpy, sys
sys.setswitchinterval(float(os.environ["SWITCH"]))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
