"""Models, weights, tokenizers and optimizers: everything stages need to build and train a model.

Also the one place that touches Tunix internals (tunix_compat, guarded by tunix_version).
"""
