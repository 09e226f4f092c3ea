"""The bundled native-thread harness (registration happens in later steps)."""
