"""freescale.tools"""
