"""ngram: prompt lookup (no weights)."""
