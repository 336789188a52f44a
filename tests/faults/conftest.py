import os
import sys

# The fault cases and helpers are imported by module name from this folder (also by report.py).
sys.path.insert(0, os.path.dirname(__file__))
