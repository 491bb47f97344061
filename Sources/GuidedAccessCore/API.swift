// The domain speaks the API's vocabulary: features, restriction states and
// errors are the API's own types.
@_exported import GuidedAccessAPI
