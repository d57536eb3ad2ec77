__version__ = "0.1.0"
# the Hugging Face Accelerate release whose API acc follows: what `accelerate.__version__` reads in a script
# `acc migrate` rewrote (its version checks then ask about the API they meet)
__accelerate_version__ = "1.15.0"
