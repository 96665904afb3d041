"""Progress bars (parlab.progress)."""


def test_a_finished_progress_bar_prints_a_line_that_stays_true_once_saved(capsys):
    """A saved notebook shows an ipywidgets bar as it was created ("0/176"): the line
    printed at the end says the bar reached its total."""
    from parlab import progress
    shown = progress.bar(3, "training")
    for _ in range(3):
        shown.update(1)
    progress.finish(shown, loss=0.25)
    assert capsys.readouterr().out.strip().endswith("training: 3/3 steps done, last loss 0.250")
    hidden = progress.bar(3, "training", enabled=False)
    progress.finish(hidden, loss=0.25)
    assert capsys.readouterr().out == ""
