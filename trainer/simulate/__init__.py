"""The bubble simulator, its hardware profiles and the cost-model calibration (never imported by training)."""
