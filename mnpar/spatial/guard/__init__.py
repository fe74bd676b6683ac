"""Spatial parallelism's guard: exact or refused while a converted model runs.

The rules (``_rules``: one row per chainer function node), the verdicts they
return (``_verdicts``, the layout arithmetic in ``_layout``, conversions in
``_convertible`` and ``_versions``), the one interception of chainer's calls
(``_guard``), ``convert`` (``_convert``) and the checks of replicas and data
(``_checks``). The marks it reads are ``spatial/_marks``'.
"""
