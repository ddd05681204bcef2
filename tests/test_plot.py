"""agentsim plot: the figure for each kind of file is drawn (a real PNG), and a file that is not
a trajectory or study gets a clear error."""

from __future__ import annotations

import pytest

from agentsim.cli import main
from agentsim.plot import plot_file

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("model, args", [
    ("sir", ["--agents", "2000", "--steps", "20"]),
    ("wolfsheep", ["--agents", "200", "--steps", "20", "--every", "5"]),
    ("boids", ["--agents", "300", "--steps", "5"]),
    ("schelling", ["--agents", "400", "--steps", "5"]),
    ("randomwalk", ["--agents", "300", "--steps", "5"]),
])
def test_every_model_file_gets_its_figure(model, args, tmp_path, capsys):
    out = tmp_path / f"{model}.h5"
    assert main(["run", model, "--quiet", "--out", str(out), *args]) == 0
    assert main(["plot", str(out)]) == 0
    png = (tmp_path / f"{model}.png").read_bytes()
    assert png[:8] == PNG and len(png) > 15_000
    assert f"wrote {tmp_path / model}.png" in capsys.readouterr().out


def test_a_study_file_gets_its_bands_and_other_files_an_error(tmp_path, capsys):
    from agentsim.study import Study

    Study("sir", {"beta": [0.03, 0.06]}, seeds=[1, 2], agents=300, steps=10).run(tmp_path / "s.h5", workers=1)
    written = plot_file(tmp_path / "s.h5", tmp_path / "bands.png")
    assert (tmp_path / "bands.png").read_bytes()[:8] == PNG and written == str(tmp_path / "bands.png")
    (tmp_path / "x.h5").write_text("not hdf5")
    assert main(["plot", str(tmp_path / "x.h5")]) == 1
    assert "cannot plot" in capsys.readouterr().err


@pytest.mark.parametrize("model, extra", [("boids", ["--agents", "200"]), ("schelling", ["--agents", "300"]),
                                          ("wolfsheep", ["--agents", "150"])])
def test_animate_writes_a_gif_of_every_recorded_frame(model, extra, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / f"{model}.h5"
    assert main(["run", model, "--quiet", "--steps", "6", "--every", "2", "--out", str(out), *extra]) == 0
    assert main(["animate", str(out), "--out", str(tmp_path / "a.gif")]) == 0
    with Image.open(tmp_path / "a.gif") as gif:
        assert gif.n_frames == 4  # steps 0, 2, 4, 6
    assert main(["animate", str(out), "--out", str(tmp_path / "a.avi")]) == 1
    assert "expected an output ending in .gif or .mp4" in capsys.readouterr().err
