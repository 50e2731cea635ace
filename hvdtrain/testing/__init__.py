"""Helpers for hvdtrain's tests and benchmarks that ship in the wheel, as ``hvdtrain bench``
uses them too:

    digit_files     scikit-learn's digits written as image folders, and its two photos
    jobs            the one job runner of the tests and the benchmarks: a job in a session of
                    its own, ended whole (with what left its session) at its time limit
    netns_cluster   "hosts" in network namespaces joined by a bridge, each with its own SSH
                    server: the multi-host tests' cluster and bench network's shaped link
"""
