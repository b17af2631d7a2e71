"""Log parsers, one module per format, and the format detection.

Built-in formats (`--format NAME`; `auto` sniffs them):
  own           autotune.instrument() JSONL
  timm          timm train.py
  imagenet      pytorch/examples imagenet/main.py (ProgressMeter)
  metriclogger  torchvision references MetricLogger, DeiT/DINO/MAE/DETR
  semseg        semseg-style `Epoch: [E/N][i/M] Data .. Batch ..`
  mmengine      OpenMMLab mmengine LogProcessor
  mmcv          OpenMMLab mmcv TextLoggerHook
  detectron2    detectron2 CommonMetricPrinter
  yolox         YOLOX trainer
  lerobot       LeRobot train.py
  hf_trainer    HuggingFace Trainer (no data time: the share is null)
  lightning     Lightning SimpleProfiler report (totals)
`regex` is built from a user's YAML file. Shared helpers: `_base` (records, anchors, skip
reasons), `_fields` (`key: value` pairs and `Name val (avg)` meters).
"""

from __future__ import annotations

from autotune.analyze.parsers._base import (LogParser, ProfileSummary, Skip, StepRecord,
                                            line_timestamp)
from autotune.analyze.parsers.detectron2 import Detectron2Parser
from autotune.analyze.parsers.hf_trainer import HFTrainerParser
from autotune.analyze.parsers.imagenet import ImagenetParser
from autotune.analyze.parsers.lerobot import LerobotParser
from autotune.analyze.parsers.lightning import LightningParser
from autotune.analyze.parsers.metriclogger import MetricLoggerParser
from autotune.analyze.parsers.mmcv import MMCVParser
from autotune.analyze.parsers.mmengine import MMEngineParser
from autotune.analyze.parsers.own import OwnParser
from autotune.analyze.parsers.regex import RegexParser
from autotune.analyze.parsers.semseg import SemsegParser
from autotune.analyze.parsers.timm import TimmParser
from autotune.analyze.parsers.yolox import YoloxParser

# Detection order breaks ties: the most specific format first.
BUILTIN: dict[str, type[LogParser]] = {
    "own": OwnParser, "timm": TimmParser, "imagenet": ImagenetParser,
    "metriclogger": MetricLoggerParser, "semseg": SemsegParser, "mmengine": MMEngineParser,
    "mmcv": MMCVParser, "detectron2": Detectron2Parser, "yolox": YoloxParser,
    "lerobot": LerobotParser, "hf_trainer": HFTrainerParser, "lightning": LightningParser,
}
FORMATS = ("auto", *BUILTIN, "regex")

__all__ = ["BUILTIN", "Detectron2Parser", "FORMATS", "HFTrainerParser", "ImagenetParser",
           "LerobotParser", "LightningParser", "LogParser", "MMCVParser", "MMEngineParser",
           "MetricLoggerParser", "OwnParser", "ProfileSummary", "RegexParser", "SemsegParser",
           "Skip", "StepRecord", "TimmParser", "YoloxParser", "line_timestamp"]
