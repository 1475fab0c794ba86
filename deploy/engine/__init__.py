"""The speculative core: one request's draft -> verify -> accept loop on the target, verification
(one draft, a token tree), draft trees and lengths, counterfactual scoring, the target model and the
cost model. No Ray; imports only actors/ and policy/."""
