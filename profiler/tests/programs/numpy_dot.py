# The hot loop is numpy.dot (OpenBLAS kernels without CFI) under known Python functions.
import sys, time
import numpy as np

a = np.random.rand(256, 256)
b = np.random.rand(256, 256)

def blas_inner():
    return a.dot(b)

def blas_outer():
    for _ in range(10):
        blas_inner()

def main(seconds):
    end = time.time() + seconds
    while time.time() < end:
        blas_outer()

main(float(sys.argv[1]))
