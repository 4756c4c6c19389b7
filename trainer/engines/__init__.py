"""Training engines: the engine protocol, the FreeScale and TorchRec engines, sharded tables, communication, PEC
overlap and online balancing.
"""
