"""flower_clair: CLAIR on LoRA adapters inside Flower (ServerApp + ClientApp)."""
