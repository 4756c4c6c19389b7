"""The evaluation protocol (id tables, splits, best-validation tracking) and HR@k / NDCG@k."""
