# CI's stand-in for the trainer's CUDA base (pytorch/pytorch): the Debian base made by
# hack/build-images.sh with PyPI's torch in a venv first on PATH, as PyTorch's image has it in
# /opt/conda. The build context is a folder of wheels (torch, what it requires, a current pip).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TORCH_VERSION
ENV PATH=/opt/torch/bin:$PATH
RUN --mount=type=bind,target=/wheels \
    python3 -m venv /opt/torch \
    && /opt/torch/bin/pip install --no-cache-dir --no-index --find-links /wheels --upgrade pip \
    && /opt/torch/bin/pip install --no-cache-dir --no-index --find-links /wheels "torch==${TORCH_VERSION}"
