import os
import sys

# Spawned ranks import the worker functions by module name from this folder.
sys.path.insert(0, os.path.dirname(__file__))
