"""Results several rules and report sections share, computed once (DESIGN §2)."""
