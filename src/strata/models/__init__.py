"""Model sources: GGUF files, Hugging Face directories, endpoints, synthetic presets."""
