"""The course's Keras models, mirroring ``parlab.torch.models``."""
from __future__ import annotations

import keras
from keras import layers


def mlp(sizes=(64, 256, 256, 128, 10), seed: int = 0) -> keras.Sequential:
    """Dense layers of the given widths with ReLU between; ``sizes[0]`` inputs."""
    if len(sizes) < 2:
        raise ValueError("an MLP needs at least an input and an output size")
    model = keras.Sequential([keras.Input((sizes[0],))])
    for i, width in enumerate(sizes[1:]):
        last = i == len(sizes) - 2
        model.add(layers.Dense(width, activation=None if last else "relu",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=seed + i)))
    return model


def cnn(width: int = 16, classes: int = 10) -> keras.Sequential:
    """A small CNN for 8x8x1 digits (channels last)."""
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        layers.Conv2D(width, 3, padding="same", activation="relu"),
        layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(4 * width, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(classes),
    ])


def deep_lstm(layers_: int = 4, hidden: int = 64, length: int = 32, classes: int = 4) -> keras.Sequential:
    """A stack of LSTM layers (each returning sequences) and a dense head."""
    model = keras.Sequential([keras.Input((length, 1))])
    for i in range(layers_):
        model.add(layers.LSTM(hidden, return_sequences=i < layers_ - 1))
    model.add(layers.Dense(classes))
    return model


def unet(base: int = 8, size: int = 32, classes: int = 3) -> keras.Model:
    """A two-level U-Net, channels last."""
    def block(x, c):
        x = layers.Conv2D(c, 3, padding="same", activation="relu")(x)
        return layers.Conv2D(c, 3, padding="same", activation="relu")(x)

    inp = keras.Input((size, size, 1))
    e1 = block(inp, base)
    e2 = block(layers.MaxPooling2D(2)(e1), 2 * base)
    b = block(layers.MaxPooling2D(2)(e2), 4 * base)
    d2 = block(layers.Concatenate()([layers.Conv2DTranspose(2 * base, 2, strides=2)(b), e2]), 2 * base)
    d1 = block(layers.Concatenate()([layers.Conv2DTranspose(base, 2, strides=2)(d2), e1]), base)
    return keras.Model(inp, layers.Conv2D(classes, 1)(d1))
