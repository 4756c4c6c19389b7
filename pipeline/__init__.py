"""freescale.pipeline"""
