"""The swarm data model. The database is the single source of truth."""
from veronica.models.a2a import A2ACall, A2AConfig, A2ACredential, A2ARemote, A2ATaskLink
from veronica.models.access import ROLE_RANK, AccessRole, ApiToken, SpaceAccess, SsoIdentity
from veronica.models.audit import AppendOnly, AuditRow
from veronica.models.content import Blackboard, MemoryFile, Skill
from veronica.models.engine import EngineLease
from veronica.models.events import Event
from veronica.models.limits import ProviderBucket, ProviderSlot, ProviderWaiter
from veronica.models.mcp import McpServer, McpTransport
from veronica.models.member import Member, Membership, Origin, PermissionMode, Phase, RetirePolicy, Role, RunStatus
from veronica.models.messaging import Message, WebhookDelivery
from veronica.models.ops import AlertTally, Channel, DeliveryStatus, NotificationDelivery, TaskCheck
from veronica.models.runtime import (
    Alarm,
    Approval,
    ApprovalRule,
    ApprovalStatus,
    Question,
    Run,
    RunOutcome,
    Session,
    Turn,
    TurnRole,
    UsageDay,
    Wake,
)
from veronica.models.secrets import Secret
from veronica.models.space import Space
from veronica.models.tasks import Task, TaskStatus, VerifyPolicy

__all__ = [
    "A2ACall", "A2AConfig", "A2ACredential", "A2ARemote", "A2ATaskLink", "AccessRole", "Alarm", "AlertTally", "ApiToken", "AppendOnly", "AuditRow", "Approval", "ApprovalRule", "ApprovalStatus", "Blackboard", "Channel", "DeliveryStatus", "EngineLease", "Event", "Member", "NotificationDelivery", "ProviderBucket", "ProviderSlot", "ProviderWaiter", "TaskCheck",
    "McpServer", "McpTransport", "Membership", "MemoryFile", "Message", "Origin", "PermissionMode", "Phase", "Question", "ROLE_RANK",
    "RetirePolicy", "Role", "Run", "RunOutcome", "RunStatus", "Secret", "SsoIdentity", "Session", "Skill", "Space", "SpaceAccess",
    "Task", "TaskStatus", "Turn", "TurnRole", "UsageDay", "VerifyPolicy", "Wake", "WebhookDelivery",
]
