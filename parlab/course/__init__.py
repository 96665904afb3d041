"""The course: one module per lab, and what the labs share.

``labNN.py`` belongs to ``labs/NN_*.ipynb``: what its notebook runs, its explorer, its
exercises (registered when it is imported) and, later, its lesson checks. The labs share
``exercise.py`` (exercises that check themselves), ``explorer.py`` (sliders that predict,
a button that measures), ``calibrate.py`` (the launch that calibrates the cost model
here) and ``student.py`` (the copy handed to students).
"""
