"""The photos ``entrain data synth`` draws its photo datasets from: real photos shipped in the
scikit-image and scikit-learn wheels (CC0 / CC-BY, see their READMEs), each with a caption, short
questions and answers, and facts its longer answers are written from; ``write_photo`` crops and
resizes one to an exact size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from entrain.core.errors import ConfigError

__all__ = ["PHOTOS", "Photo", "write_photo"]


@dataclass(frozen=True)
class Photo:
    package: str  # "skimage" or "sklearn"
    file: str
    caption: str
    subject: str
    qa: tuple[tuple[str, str], ...]
    facts: tuple[str, ...]


PHOTOS: tuple[Photo, ...] = (
    Photo("skimage", "astronaut.png", "Color image of the astronaut Eileen Collins.", "the astronaut",
          (("what is the color of the spacesuit", "orange"), ("what is the astronaut resting her arm on", "helmet"),
           ("what flag hangs behind the astronaut", "american flag"), ("what model stands behind her", "space shuttle")),
          ("The astronaut Eileen Collins wears an orange spacesuit.", "An American flag hangs on the left.",
           "A model of the space shuttle stands behind her on the right.", "She rests her arm on a white helmet.",
           "She smiles at the camera.", "Mission patches are sewn onto the suit.")),
    Photo("skimage", "coffee.png", "Coffee cup.", "the coffee cup",
          (("what is on the saucer", "cup"), ("what color is the saucer", "red"), ("what lies next to the cup", "spoon"),
           ("what is the cup standing on", "wooden table")),
          ("A red cup of coffee sits on a matching red saucer.", "A small silver spoon lies on the saucer.",
           "The saucer stands on a wooden table.", "The coffee has a light brown crema on top.",
           "The photo is taken from above at an angle.")),
    Photo("skimage", "chelsea.png", "Chelsea the cat.", "the cat",
          (("what animal is shown", "cat"), ("what color are the eyes of the cat", "green"),
           ("what is the name of the cat", "chelsea"), ("what pattern does the fur have", "stripes")),
          ("Chelsea is a tabby cat with striped fur.", "The cat looks straight at the camera.",
           "Her eyes are green and wide open.", "Long white whiskers spread from her nose.",
           "The background is out of focus.")),
    Photo("skimage", "rocket.jpg", "Launch photo of DSCOVR on Falcon 9 by SpaceX.", "the rocket",
          (("what stands on the launch pad", "rocket"), ("what time of day is it", "night"),
           ("what surrounds the launch pad", "towers"), ("which company built the rocket", "spacex")),
          ("A Falcon 9 rocket stands on the launch pad at dusk.", "The rocket carries the DSCOVR satellite.",
           "Tall lightning towers surround the pad.", "Bright lights shine along the ground.",
           "The sky is deep blue.")),
    Photo("skimage", "motorcycle_left.png", "A red motorcycle parked in a workshop.", "the motorcycle",
          (("what vehicle is shown", "motorcycle"), ("what color is the motorcycle", "red"),
           ("where is the motorcycle parked", "workshop"), ("what stands behind the motorcycle", "shelves")),
          ("A red motorcycle is parked inside a workshop.", "Shelves with cardboard boxes stand behind it.",
           "The motorcycle has chrome exhaust pipes.", "The floor is grey concrete.",
           "A wooden bench is visible on the left.")),
    Photo("skimage", "hubble_deep_field.jpg", "Hubble eXtreme Deep Field.", "the deep field",
          (("what does the image show", "galaxies"), ("what color is the background", "black"),
           ("which telescope took the image", "hubble")),
          ("Thousands of distant galaxies glow against the black sky.", "The image was taken by the Hubble Space Telescope.",
           "Some galaxies look red and others blue.", "It is one of the deepest views of the universe.")),
    Photo("skimage", "retina.jpg", "Human retina.", "the retina",
          (("what part of the body is shown", "eye"), ("what color is the retina", "orange"),
           ("what branches across the retina", "blood vessels")),
          ("The photo shows the back of a human eye.", "Blood vessels branch out from the optic disc.",
           "The optic disc is the bright spot on the left.", "The fovea is the darker spot in the middle.",
           "A black border surrounds the round field of view.")),
    Photo("skimage", "ihc.png", "Immunohistochemical (IHC) staining with hematoxylin counterstaining.", "the tissue",
          (("what kind of image is this", "microscopy"), ("what color is the stain", "brown"),
           ("what colors the nuclei blue", "hematoxylin")),
          ("The tissue is stained brown by immunohistochemistry.", "Hematoxylin counterstaining colors the nuclei blue.",
           "Several gland-like structures fill the view.", "The image was taken through a microscope.")),
    Photo("sklearn", "china.jpg", "A Chinese pagoda on a hill above a lake.", "the pagoda",
          (("what building is shown", "pagoda"), ("what lies behind the pagoda", "lake"),
           ("what grows around the building", "trees")),
          ("A tall Chinese pagoda with red pillars stands on a hill.", "Trees grow around the building.",
           "A lake stretches out in the background.", "The sky is pale and hazy.")),
    Photo("sklearn", "flower.jpg", "An orange dahlia flower.", "the flower",
          (("what is shown in the picture", "flower"), ("what color is the flower", "orange"),
           ("what color are the leaves", "green")),
          ("An orange dahlia blooms in front of dark green leaves.", "Its petals are arranged in tight rings.",
           "A second flower is visible at the bottom.", "The background is blurred.")),
)  # fmt: skip


def _photo_path(photo: Photo) -> Path:
    try:
        if photo.package == "skimage":
            import skimage

            return Path(skimage.__file__).parent / "data" / photo.file
        import sklearn

        return Path(sklearn.__file__).parent / "datasets" / "images" / photo.file
    except ModuleNotFoundError:
        raise ConfigError(
            "synthesising photo datasets needs the packages 'scikit-image' and 'scikit-learn' "
            "(they ship the photos): pip install scikit-image scikit-learn"
        ) from None


def _cover(im, width: int, height: int):
    """``im`` scaled to cover ``width x height`` and centre-cropped to exactly that size."""
    from PIL import Image

    scale = max(width / im.width, height / im.height)
    w, h = max(width, round(im.width * scale)), max(height, round(im.height * scale))
    im = im.resize((w, h), Image.Resampling.BICUBIC)
    left, top = (w - width) // 2, (h - height) // 2
    return im.crop((left, top, left + width, top + height))


def write_photo(photo: Photo, height: int, width: int, path: Path) -> None:
    """``photo`` scaled and centre-cropped to exactly ``height x width`` pixels, saved at ``path``."""
    from PIL import Image

    with Image.open(_photo_path(photo)) as src:
        _cover(src.convert("RGB"), width, height).save(path, quality=90)
