"""Engine benchmarks: step times against the roofline estimate, the naive baseline, hardware rates,
calibration.
"""
