"""Progress bars (parlab.progress)."""


def test_a_finished_progress_bar_ends_on_its_total_in_text_a_saved_notebook_keeps(capsys):
    """A widget bar is saved as it was created ("0/176"); the text bar's last state is
    what a saved notebook shows: its total, and the last loss."""
    from parlab import progress
    shown = progress.bar(3, "training")
    for _ in range(3):
        shown.update(1)
    progress.finish(shown, loss=0.25)
    out = capsys.readouterr().out
    last = out.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("training: 100%") and "3/3" in last and "loss=0.250" in last, out
    hidden = progress.bar(3, "training", enabled=False)
    progress.finish(hidden, loss=0.25)
    assert capsys.readouterr().out == ""


def test_a_bar_redraws_at_most_twice_a_second_not_every_step(capsys):
    """Every redraw is an output kept in the saved notebook: 1000 quick steps (with the
    loss set as the training loops set it) make a few, not 1000."""
    from parlab import progress
    shown = progress.bar(1000, "training")
    for _ in range(1000):
        shown.update(1)
        shown.set_postfix(loss="0.100", refresh=False)
    progress.finish(shown)
    assert capsys.readouterr().out.count("\r") < 20
