"""The dense model (HSTU / SASRec sequential transducer) and its loss."""
