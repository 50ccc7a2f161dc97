"""torch + transformers: the vision-language model built from Hugging Face configs, cut into stages.

Importing this package registers the packed causal attention with transformers."""
