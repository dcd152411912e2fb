"""Adapters to other frameworks, each under its own optional extra; the framework is imported only when called.

``ultralytics``: ``ptt.ultralytics.accelerate(model)`` (``pip install 'pytorchtricks[ultralytics]'``).
"""
