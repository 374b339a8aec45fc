"""The NFS lab: the real Linux NFS server and client in a VM, for tests and benchmarks.

``python -m bench.nfslab build`` makes the boot files once (image.py); ``python -m bench.nfslab
run SUITE`` boots a VM per profile, runs the suite inside (guest.py) and copies the results
out (vm.py). The suites are in suites.py.
"""
