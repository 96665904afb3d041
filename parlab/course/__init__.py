"""The course: one module per lab, and what the labs share.

``labNN.py`` belongs to ``labs/NN_*.ipynb``: what its notebook runs, its explorer, its
exercises and its lessons (both registered when it is imported). The labs share
``exercise.py`` (exercises that check themselves), ``lessons.py`` (each quantitative claim
of a lab as a check its run evaluates; ``python -m parlab lessons``), ``explorer.py``
(sliders that predict, a button that measures), ``calibrate.py`` (the launch that
calibrates the cost model here) and ``student.py`` (the copy handed to students).
"""
