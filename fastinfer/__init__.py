"""FastInfer: a hardware-aware ResNet-50 classification service and its measuring tools."""

__version__ = "0.1.0"
