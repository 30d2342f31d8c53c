"""Kubernetes' own rules for the values lockstep writes into Kubernetes objects.

Pure: no I/O, no Kubernetes client. `lockstep check`, the admission webhook and the
operator's reconcile run these (through `lockstep.api.models.cross_field_problems`), so a
value the API server, the kubelet or Kueue would refuse on every pod is refused when the
PDDeployment is written, naming the field and the fix, instead of leaving groups that
never start.

Each rule is Kubernetes' published one, rewritten here from its definition:
- names and labels, from k8s.io/apimachinery/pkg/util/validation (`IsDNS1123Label`,
  `IsDNS1123Subdomain`, `IsDNS1035Label`, `IsQualifiedName` for label keys,
  `IsValidLabelValue`, `IsEnvVarName`, `IsConfigMapKey`) and the "Object Names and IDs"
  and "Labels and Selectors" pages of kubernetes.io;
- quantities, from the grammar in the doc comment of k8s.io/apimachinery/pkg/api/
  resource/quantity.go (signed decimal number; binary `Ki`..`Ei`, decimal `n u m k M G T
  P E` or an `e`/`E` exponent) and the suffixes its parser accepts;
- node selector requirements, tolerations, env var sources and container resources,
  from k8s.io/kubernetes/pkg/apis/core/validation (`ValidateNodeSelectorRequirement`,
  `ValidateNodeFieldSelectorRequirement`, `validateTolerations`, `validateEnvVarValueFrom`,
  `ValidateResourceRequirements`) and the API reference of `NodeAffinity`, `Toleration`,
  `EnvVarSource` and `ResourceRequirements`;
- image references, from the grammar of github.com/distribution/reference (the one the
  kubelet parses an image with before it pulls; what does not parse ends the container
  in `InvalidImageName`);
- Kueue's queue name: the `kueue.x-k8s.io/queue-name` label names a LocalQueue, so Kueue
  refuses a value that is not a DNS-1123 subdomain (its job framework's validation).

Why no library: the operator's pure core may not import the Kubernetes client (the
`pure-core` import contract in pyproject.toml), and the client has no validator for
names, labels, selectors or images anyway; its one parser, `kubernetes.utils.
parse_quantity`, is laxer than the API server (it takes "NaN", "1K", "1_000" and " 1",
which the API server refuses). `kubernetes-validate` checks manifests against the
OpenAPI schemas, which carry no name or label patterns, and is a development tool, not a
dependency of the operator. No well-kept Python package implements the rules above.
"""

from __future__ import annotations

from lockstep.api.k8s_rules.containers import (
    ENV_FIELD_PATHS,
    ENV_RESOURCES,
    ENV_SOURCES,
    STANDARD_CONTAINER_RESOURCES,
    container_resources,
    env_var_source,
)
from lockstep.api.k8s_rules.names import (
    CONFIG_MAP_KEY_MAX,
    DNS1123_LABEL_MAX,
    DNS1123_SUBDOMAIN_MAX,
    FIX_DNS1035_LABEL,
    FIX_DNS1123_LABEL,
    FIX_DNS1123_SUBDOMAIN,
    FIX_ENV_VAR_NAME,
    FIX_IMAGE,
    FIX_LABEL_KEY,
    FIX_LABEL_VALUE,
    FIX_QUANTITY,
    IMAGE_NAME_MAX,
    LABEL_VALUE_MAX,
    QUALIFIED_NAME_MAX,
    config_map_key,
    dns1035_label,
    dns1123_label,
    dns1123_subdomain,
    env_var_name,
    label_value,
    qualified_name,
)
from lockstep.api.k8s_rules.scheduling import (
    node_affinity,
    node_selector_field_requirement,
    node_selector_requirement,
    node_selector_term,
    toleration,
)
from lockstep.api.k8s_rules.values import Violation, image_reference, parse_quantity

__all__ = [
    "CONFIG_MAP_KEY_MAX",
    "DNS1123_LABEL_MAX",
    "DNS1123_SUBDOMAIN_MAX",
    "ENV_FIELD_PATHS",
    "ENV_RESOURCES",
    "ENV_SOURCES",
    "FIX_DNS1035_LABEL",
    "FIX_DNS1123_LABEL",
    "FIX_DNS1123_SUBDOMAIN",
    "FIX_ENV_VAR_NAME",
    "FIX_IMAGE",
    "FIX_LABEL_KEY",
    "FIX_LABEL_VALUE",
    "FIX_QUANTITY",
    "IMAGE_NAME_MAX",
    "LABEL_VALUE_MAX",
    "QUALIFIED_NAME_MAX",
    "STANDARD_CONTAINER_RESOURCES",
    "Violation",
    "config_map_key",
    "container_resources",
    "dns1035_label",
    "dns1123_label",
    "dns1123_subdomain",
    "env_var_name",
    "env_var_source",
    "image_reference",
    "label_value",
    "node_affinity",
    "node_selector_field_requirement",
    "node_selector_requirement",
    "node_selector_term",
    "parse_quantity",
    "qualified_name",
    "toleration",
]
