"""Helpers for hvdtrain's tests and benchmarks that ship in the wheel, as ``hvdtrain bench``
uses them too:

    digit_files     scikit-learn's digits written as image folders, and its two photos
"""
