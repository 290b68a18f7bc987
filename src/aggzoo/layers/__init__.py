"""Small reusable pieces shared by heads: pooling, Sinkhorn, attention, norms."""
