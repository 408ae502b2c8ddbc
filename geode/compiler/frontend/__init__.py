"""Front ends: the Python builder and the ONNX importer."""
